"""How the Docker Engine's failures leave the runtime: every one an
EngineError, ContainerGone for a container (or exec) the engine does not
know, EngineUnreachable when it did not answer at all. Shared by the engine's
streams (runtime/engine/streams.py) and the Swarm door's client."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from gpuhost_agent.errors import OutsideFailure


class EngineError(OutsideFailure, RuntimeError):
    """The Docker Engine refused or did not answer."""


class ContainerGone(EngineError):
    """404: the container (or the exec) does not exist, or no longer does."""


class EngineUnreachable(EngineError):
    """No answer: the engine is down, restarting, or the connection broke."""


class AnswerTooLarge(EngineError):
    """The engine's answer was over the bytes the call reads: what a renter's
    image or container made of it (runtime/engine/calls.py, `max_bytes`)."""


def error_message(raw: bytes) -> str:
    """The `message` of the engine's JSON error body (or the body itself), cut to 500 characters."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip()[:500]
    message = body.get("message") if isinstance(body, dict) else None
    return str(message)[:500] if message is not None else ""


async def response_error(response: aiohttp.ClientResponse) -> EngineError:
    """The EngineError an error response of the engine stands for."""
    try:
        raw = await response.content.read(16 * 1024)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        raw = b""
    message = f"Docker Engine: {response.status} {error_message(raw) or response.reason}"
    return ContainerGone(message) if response.status == 404 else EngineError(message)

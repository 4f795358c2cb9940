"""What the client makes of the marketplace's replies: the errors it raises, and
how it reads a body (capped, strict JSON, a short message for a refusal).

Apart from client.py, which makes the calls, because every caller of the
client acts on these errors (the outbox, the loops in core, the SSH server),
and because reading a reply is where a misbehaving marketplace is contained:
an oversized, malformed or hostile body becomes one of these errors, never a
crash of the loop that asked, nor a message that quotes what it sent.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from gpuhost_agent.common.capped_body import read_up_to
from gpuhost_agent.errors import OutsideFailure

# Error replies are only read for their message.
_MAX_ERROR_BODY_BYTES = 64 * 1024
_MAX_ERROR_MESSAGE_CHARS = 500


class MarketplaceUnavailable(OutsideFailure, RuntimeError):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class MarketplaceAuthFailed(MarketplaceUnavailable):
    """401/403: the key is wrong, expired or rotated. Retried like an outage, so
    that no report is lost while an operator fixes the configuration."""


class MarketplaceRejected(OutsideFailure, RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


class ReplyTooLarge(MarketplaceRejected):
    """A reply over the client's size cap; the body was not read past the cap."""


def parse_retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


async def error_message(response: aiohttp.ClientResponse) -> str:
    """The marketplace's message for a refusal, short: only {"message": ...} of
    a small JSON body is shown, never the body itself."""
    try:
        raw = await read_capped(response, _MAX_ERROR_BODY_BYTES, "error reply")
        body = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError, MarketplaceRejected):
        body = None
    if isinstance(body, dict) and "message" in body:
        message = body["message"] if isinstance(body["message"], str) else json.dumps(body["message"])[:200]
        return message if len(message) <= _MAX_ERROR_MESSAGE_CHARS else message[:_MAX_ERROR_MESSAGE_CHARS] + "..."
    return response.reason or "request refused"


async def read_capped(response: aiohttp.ClientResponse, cap: int, what: str) -> bytes:
    """The reply's body, read up to `cap` bytes and no further: a marketplace
    that sends more (by its Content-Length or by what actually arrives, after
    decompression) is refused instead of filling the agent's memory."""
    raw = await read_up_to(response, cap)
    if raw is None:
        raise ReplyTooLarge(response.status, f"the reply to {what} is larger than {cap} bytes")
    return raw


def decode_json(raw: bytes, status: int, what: str) -> Any:
    """Strict JSON (no NaN or Infinity, no lone bytes outside UTF-8). The
    message never quotes the body: it may be large, and may hold anything."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise MarketplaceRejected(status, f"malformed JSON in the reply to {what} ({_json_problem(exc)})") from None


class _NotJSON(OutsideFailure, ValueError):
    """NaN, Infinity and -Infinity: Python's json reads them, JSON has none."""


def _refuse_constant(name: str) -> Any:
    raise _NotJSON(f"{name} is not a JSON number")


def _json_problem(exc: BaseException) -> str:
    """Where or how the JSON broke, without quoting any of it."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at character {exc.pos}"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 at byte {exc.start}"
    if isinstance(exc, _NotJSON):
        return str(exc)
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return "a value Python cannot read, such as an integer of thousands of digits"

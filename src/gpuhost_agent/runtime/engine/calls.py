"""The agent's one HTTP client of the Docker Engine's API: an aiohttp session
on the engine's socket (DOCKER_HOST), made on first use in the running loop.

The engine's short calls (runtime/engine/client.py) and its long streams
(runtime/engine/streams.py) both go through it. It replaced docker-py for
the short calls: docker-py blocks, so each call took a worker
thread, and it brought requests, urllib3 and their tables into every agent,
about 7 MB of a 62 MB idle agent; this session is the same aiohttp the
agent speaks to its marketplace with, and a call costs no thread.

Every failure leaves as an EngineError (runtime/engine/errors.py):
EngineUnreachable when the engine did not answer, ContainerGone for a 404,
plain EngineError when it answered with another error.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any, cast

import aiohttp

from gpuhost_agent.common.capped_body import read_up_to
from gpuhost_agent.runtime.docker_host import Endpoint, parse_docker_host
from gpuhost_agent.runtime.engine.errors import AnswerTooLarge, EngineError, EngineUnreachable
from gpuhost_agent.runtime.engine.errors import response_error as _error
from gpuhost_agent.runtime.engine.records import ContainerSummary

# Container ids and names, exec ids: no '/', '?', '%' or spaces can reach a path.
_ID = re.compile(r"^/?[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def checked_id(value: str) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise EngineError(f"not a container or exec id: {value!r}"[:200])
    return value.lstrip("/")


def filters_param(**kinds: list[str] | str | None) -> dict[str, str]:
    """The Engine API's `filters` parameter: each kind to its values."""
    chosen = {kind: [values] if isinstance(values, str) else list(values) for kind, values in kinds.items() if values}
    return {"filters": json.dumps(chosen)} if chosen else {}


class EngineCalls:
    """An aiohttp session on the engine's socket, made on first use (in the
    running loop, and again in a later loop: the probe's CLI runs one loop,
    a test several); DOCKER_HOST is read then, and a bad one fails each call."""

    def __init__(self, docker_host: str | None = None, *, timeout: float = 30, headers: dict[str, str] | None = None):
        self._docker_host = docker_host
        self._timeout = timeout
        self._headers = dict(headers or {})  # sent with every request (a worker's key: streams/door.py)
        self._http: aiohttp.ClientSession | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None
        self._endpoint: Endpoint | None = None

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._http is None or self._http.closed or self._http_loop is not loop:
            self._endpoint = parse_docker_host(
                self._docker_host or os.environ.get("DOCKER_HOST"), tls=bool(os.environ.get("DOCKER_TLS_VERIFY"))
            )
            connector = (
                aiohttp.UnixConnector(path=self._endpoint.unix_path, limit=0)
                if self._endpoint.unix_path
                else aiohttp.TCPConnector(limit=0)
            )
            self._http = aiohttp.ClientSession(
                base_url=self._endpoint.base_url, connector=connector, auto_decompress=False, headers=self._headers
            )
            self._http_loop = loop
        return self._http

    async def close(self) -> None:
        http, self._http = self._http, None
        if http is not None and self._http_loop is asyncio.get_running_loop():
            await http.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> Any:
        """One short request; the decoded JSON reply (None when it has none)."""
        raw, content_type = await self._call_raw(
            method, path, body=body, params=params, timeout=timeout, max_bytes=max_bytes
        )
        try:
            return json.loads(raw) if raw and content_type == "application/json" else None
        except ValueError as exc:
            raise EngineError(f"Docker Engine answered {method} {path} with malformed JSON") from exc

    async def _call_raw(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> tuple[bytes, str]:
        """One short request; its body and content type. With `max_bytes`,
        AnswerTooLarge once the body is longer: an answer a renter's image
        made (its configuration, copied into each container) is not read whole."""
        try:
            async with self._session().request(
                method, path, json=body, params=params, timeout=aiohttp.ClientTimeout(total=timeout or self._timeout)
            ) as response:
                if response.status >= 400:
                    raise await _error(response)
                if max_bytes is None:
                    return await response.read(), response.content_type
                if (raw := await read_up_to(response, max_bytes)) is None:
                    raise AnswerTooLarge(f"Docker Engine answered {method} {path} with over {max_bytes:,} bytes")
                return raw, response.content_type
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise EngineUnreachable(f"Docker Engine unreachable: {type(exc).__name__}: {exc}") from exc

    async def _inspect_here(self, container_id: str, max_bytes: int | None = None) -> dict:
        """`docker inspect` of a container of this engine."""
        reply = await self._call("GET", f"/containers/{checked_id(container_id)}/json", max_bytes=max_bytes)
        if not isinstance(reply, dict):
            raise EngineError("Docker Engine answered a container inspect without an object")
        return reply

    async def _containers_here(self, labels: list[str]) -> list[ContainerSummary]:
        """`docker ps -a` on this engine of the containers carrying every one of `labels`."""
        reply = await self._call("GET", "/containers/json", params={"all": "1", **filters_param(label=labels)})
        listed = [item for item in reply if isinstance(item, dict)] if isinstance(reply, list) else []
        return cast("list[ContainerSummary]", listed)

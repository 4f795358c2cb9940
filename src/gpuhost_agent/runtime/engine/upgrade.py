"""An HTTP/1.1 upgrade to a raw stream, done by hand: the engine's for a TTY
exec (runtime/engine/streams.py), a Swarm door's for a tunnel's last hop,
a file session or an exec on another machine (runtime/door_client.py).

The answer comes from the engine or from another machine's agent, which is
untrusted: whatever it sends, the caller gets the stream, ContainerGone (404),
EngineError (another status, with its message), or EngineUnreachable, and on
every failure the connection is closed here.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gpuhost_agent.runtime.engine.errors import ContainerGone, EngineError, EngineUnreachable, error_message

Writer = TypeVar("Writer", bound=asyncio.StreamWriter)

_STATUS_LINE = re.compile(r"HTTP/\d\.\d (\d{3})(?: |$)")
# What a broken connection, or an answer that is not HTTP, raises while it is read.
_BROKEN = (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)


def upgrade_request(path: str, host: str, headers: dict[str, str], body: bytes) -> bytes:
    """A POST asking the engine (or a door to one) to upgrade to the raw stream."""
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Type: application/json\r\n"
        f"Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


async def upgrade_answer(reader: asyncio.StreamReader, timeout: float) -> None:
    """Returns on 101 or 200 (the stream is then the caller's); any other
    status raises ContainerGone (404) or EngineError with the engine's message,
    and an answer with no status line ValueError."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    found = _STATUS_LINE.match(status_line)
    if found is None:
        raise ValueError(f"not an HTTP status line: {status_line[:80]!r}")
    status = int(found.group(1))
    if status in (101, 200):
        return
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    detail = await asyncio.wait_for(reader.read(min(int(length.group(1)), 4096) if length else 4096), 5)
    raise (ContainerGone if status == 404 else EngineError)(f"Docker Engine: {error_message(detail) or status_line}")


async def upgraded(
    connect: Callable[[], Awaitable[tuple[asyncio.StreamReader, Writer]]],
    send_head: Callable[[Writer], None],
    *,
    timeout: float,
    failed: str,
) -> tuple[asyncio.StreamReader, Writer]:
    """Connect, send the request's head (`send_head`), read the answer: the
    connection both ways, or the failure with the connection closed.
    `failed`: how EngineUnreachable starts ("Docker Engine: exec start failed")."""
    try:
        reader, writer = await asyncio.wait_for(connect(), timeout)
    except _BROKEN as exc:
        raise EngineUnreachable(f"{failed}: {type(exc).__name__}: {exc}") from exc
    try:
        send_head(writer)
        await upgrade_answer(reader, timeout)
    except _BROKEN as exc:
        writer.close()
        raise EngineUnreachable(f"{failed}: {type(exc).__name__}: {exc}") from exc
    except EngineError:
        writer.close()
        raise
    return reader, writer

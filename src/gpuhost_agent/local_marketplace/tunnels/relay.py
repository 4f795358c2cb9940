"""One client connection of a tunnel: relayed to the agent's stream, byte for
byte, both ways (docs/streams.md, "tunnel").

A byte relay rather than an HTTP proxy: request and response bodies stream as
they come, server-sent events and WebSocket upgrades pass untouched, and no
request has a time limit, because nothing here reads HTTP. The one exception
is an HTTP tunnel whose agent could not connect: the client then gets an HTTP
answer from us (503 with Retry-After while the service is not listening yet,
502 with the reason otherwise), never a bare reset.

A connection that carries no byte either way for IDLE_SECONDS is closed, so
clients that connect and go quiet cannot hold the relay's descriptors and the
agent's streams for ever. Ten minutes, like the TCP idle timeouts of common
load balancers (350 s and up): long enough for an interactive session's
pauses, and any client that sends keep-alives (ssh's ServerAliveInterval,
WebSocket pings) stays open as long as it likes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Awaitable, Callable
from html import escape

from aiohttp import WSMsgType, web

from gpuhost_agent.local_marketplace.tunnels import requests as tunnel_requests
from gpuhost_agent.protocol import wire

CHUNK = 64 * 1024
EOF_MESSAGE = json.dumps({"type": "eof"})
REQUEST_HEAD_LIMIT = 64 * 1024
REQUEST_HEAD_WAIT = 5.0
RETRY_AFTER_SECONDS = 2
IDLE_SECONDS = 600.0


QUICK_ACK = getattr(socket, "TCP_QUICKACK", None)  # Linux's


class _Activity:
    """When a byte last went either way; and, on the client's socket, an
    acknowledgement sent at once for what it sent (TCP_QUICKACK, renewed at
    each read: the kernel falls back to delayed ACKs by itself). A client
    that writes two small messages in a row, as OpenSSH does during its key
    exchange and its login, holds the second (Nagle) until the first is
    acknowledged, and Linux delays that by up to 40 ms: `ssh host true`
    through the local marketplace took 182 ms with delayed ACKs, 103 ms
    without."""

    def __init__(self, client_socket: object | None = None) -> None:
        self.last = time.monotonic()
        self._socket = client_socket if QUICK_ACK is not None else None
        self.received()

    def touch(self) -> None:
        """A byte went to the client."""
        self.last = time.monotonic()

    def received(self) -> None:
        """Bytes came from the client: acknowledged at once."""
        self.last = time.monotonic()
        if self._socket is not None:
            try:
                self._socket.setsockopt(socket.IPPROTO_TCP, QUICK_ACK, 1)  # type: ignore[attr-defined]
            except OSError:  # closed, or not TCP: nothing to hurry
                self._socket = None

    async def until_idle(self, idle_seconds: float) -> None:
        """A deadline that moves with each byte: one timer, not one per chunk."""
        while True:
            left = self.last + idle_seconds - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(left)


Forward = Callable[[Callable[[], None]], Awaitable[None]]


async def relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    agent: web.WebSocketResponse,
    *,
    idle_seconds: float = IDLE_SECONDS,
    forward: Forward | None = None,
) -> None:
    """Until the agent closes the stream, both sides shut down sending, or
    nothing moved for `idle_seconds`. The client's bytes go as they come,
    or through `forward` (an http tunnel's requests: tunnel_requests.py),
    which is given the activity's touch; either way the agent is told when
    the client's side is done."""
    activity = _Activity(writer.get_extra_info("socket"))
    up = asyncio.create_task(_client_to_agent(reader, agent, activity, forward))
    down = asyncio.create_task(_agent_to_client(agent, writer, activity))
    idle = asyncio.create_task(activity.until_idle(idle_seconds))
    try:
        done, _ = await asyncio.wait({up, down, idle}, return_when=asyncio.FIRST_COMPLETED)
        if idle in done or down in done or (up in done and up.exception() is not None):
            return  # idle, the agent ended the stream, or the client went away
        await asyncio.wait({down, idle}, return_when=asyncio.FIRST_COMPLETED)  # half-closed: the service may answer
    finally:
        for task in (up, down, idle):
            task.cancel()
        await asyncio.gather(up, down, idle, return_exceptions=True)


async def _client_to_agent(
    reader: asyncio.StreamReader, agent: web.WebSocketResponse, activity: _Activity, forward: Forward | None
) -> None:
    if forward is not None:
        try:
            await forward(activity.received)
        except tunnel_requests.Unframed:
            pass  # nothing more is forwarded: the service answers what it has and closes
    else:
        while chunk := await reader.read(CHUNK):
            activity.received()
            await agent.send_bytes(chunk)  # waits while the agent's side is full: the backpressure
    await agent.send_str(EOF_MESSAGE)


async def _agent_to_client(agent: web.WebSocketResponse, writer: asyncio.StreamWriter, activity: _Activity) -> None:
    while True:
        message = await agent.receive()
        if message.type is WSMsgType.BINARY:
            activity.touch()
            writer.write(message.data)
            await writer.drain()
        elif message.type is WSMsgType.TEXT:
            if message.data == EOF_MESSAGE or _is_eof(message.data):
                if writer.can_write_eof():
                    writer.write_eof()
            elif _is_end(message.data):
                return
        else:  # closing, closed or an error: the stream is over
            return


async def read_head(reader: asyncio.StreamReader) -> bytes | None:
    """A request's head (through the blank line), or None: too slow, too long, cut off."""
    try:
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_HEAD_WAIT)
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None


async def answer_unavailable(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    status: int,
    reason: str,
    *,
    starting: bool,
    head_read: bool = False,
) -> None:
    """An HTTP answer of our own for a client of an HTTP tunnel that cannot be
    connected. The request head is read first (unless it was already):
    closing a socket with unread data resets it, and the client might lose
    the answer."""
    if not head_read:
        await read_head(reader)
    if starting:
        text = "The service is starting: it does not accept connections yet. This page retries by itself."
        await write_answer(writer, 503, [("Retry-After", str(RETRY_AFTER_SECONDS))], text, refresh=True)
    else:
        text = f"The tunnel could not reach the service: {reason} (status {status})."
        await write_answer(writer, 502, [], text)


TITLES = {
    200: "OK",
    302: "Found",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    429: "Too Many Requests",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


async def write_answer(
    writer: asyncio.StreamWriter,
    code: int,
    headers: list[tuple[str, str]],
    text: str,
    *,
    refresh: bool = False,
    go_to: str = "",
) -> None:
    """A whole HTTP/1.1 response of ours (a small HTML page), then the
    connection closes. `refresh`: the page reloads itself after a while;
    `go_to`: it goes on at once to that path of the tunnel."""
    title = TITLES.get(code, "Error")
    meta = f'<meta http-equiv="refresh" content="{RETRY_AFTER_SECONDS}">' if refresh else ""
    if go_to:
        meta = f'<meta http-equiv="refresh" content="0; url={escape(go_to, quote=True)}">'
        text = f"{text}: going on to {go_to}"
    body = (
        f"<!doctype html><html><head><title>{code} {title}</title>{meta}</head>"
        f"<body><h1>{title}</h1><p>{escape(text)}</p></body></html>\n"
    ).encode()
    extra = "".join(f"{key}: {value}\r\n" for key, value in headers)
    writer.write(
        f"HTTP/1.1 {code} {title}\r\nContent-Type: text/html; charset=utf-8\r\n{extra}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(ConnectionError, OSError):
        await writer.drain()


def is_not_listening(status: int, message: str) -> bool:
    """The agent's refusal when the service does not accept connections yet
    (streams/tunnel.py), told apart from other 503s (agent not connected, too
    many streams) that are no reason to tell a client the service is starting."""
    return status == 503 and wire.TUNNEL_NOT_LISTENING in message


def _is_eof(text: str) -> bool:
    return _message_type(text) == "eof"


def _is_end(text: str) -> bool:
    return _message_type(text) == "end"


def _message_type(text: str) -> object:
    try:
        message = json.loads(text)
    except ValueError:
        return None
    return message.get("type") if isinstance(message, dict) else None

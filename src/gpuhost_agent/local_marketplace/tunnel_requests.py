"""An HTTP tunnel's client side, request by request (docs/streams.md, "tunnel").

Every request a client sends through an `http` tunnel is read before it is
passed on, so that the gate (basic auth) judges each and our cookies are
stripped from each (local_marketplace/tunnel_auth.py). Until 2026-11-28 only
a connection's first request was read and the others were forced onto new
connections with `Connection: close`; each new connection is a new stream
through the agent (about 8 ms on this project's 2-core machine), so 50
keep-alive clients got 225 requests a second where the service alone gave
16 800 (bench/tunnel.py). Now a kept-alive connection stays one stream.

Only the client's direction is read, and only as far as HTTP/1.1 frames it
(RFC 9112 section 6): the head, then exactly the body its head announces,
forwarded byte for byte. Whatever the service answers passes back as bytes.
A request whose framing two parsers could read two ways (both
Content-Length and Transfer-Encoding, a coding other than `chunked`, two
different lengths, a chunk line with a bare CR or LF, a header name that is
not a token) is never forwarded: that is how a request hides in another's
body and past the gate (request smuggling). Such a request, or one the gate
refuses after the first, ends the connection: the service is told the
client is done sending, answers what it was sent, and closes. An answer of
ours cannot be put in the middle of the service's answers, whose ends we do
not read; a client retries on a new connection, whose first request gets
the gate's answer.

An upgrade (WebSocket) or CONNECT hands the rest of the connection to the
byte relay, as before, and so does an HTTP/1.0 request, still sent with
`Connection: close` (its keep-alive is opt-in and rare).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpuhost_agent.local_marketplace.tunnel_auth import Decision, Gate, Head, parse_head, stripped

CHUNK = 64 * 1024
LINE_LIMIT = 4096  # a chunk-size line or a trailer line
TRAILERS_LIMIT = 64 * 1024
TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a tab is allowed in a field value
CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,15})(;[\x20-\x7e\t]*)?\r\n")

Send = Callable[[bytes], Awaitable[None]]
Forwardable = Callable[[Head], Awaitable[Head | None]]  # the head to send on, or None: end the connection


class Unframed(Exception):
    """A request whose body cannot be told apart from the next request."""


@dataclass(frozen=True)
class Framing:
    """How the request's body ends: "none", "length" (`length` bytes),
    "chunked", or "rest" (the connection's remaining bytes, relayed as they
    come: upgrades, CONNECT, HTTP/1.0)."""

    kind: str
    length: int = 0


def framing(head: Head) -> Framing:
    """The body's framing as HTTP/1.1 reads it; Unframed when it is ambiguous.
    A bare CR, LF or NUL anywhere in the head is refused too: the head is
    forwarded as parsed, and a lenient service would read one as a line end."""
    if not TOKEN.fullmatch(head.method.encode("latin-1")) or CONTROL.search(head.target + head.version):
        raise Unframed("a request line with a control character")
    for name, value in head.headers:
        if not TOKEN.fullmatch(name.encode("latin-1")):
            raise Unframed(f"header name {name[:40]!r} is not a token")
        if CONTROL.search(value):
            raise Unframed(f"header {name[:40]!r} holds a control character")
    if head.version != "HTTP/1.1" or head.get("Upgrade") is not None or head.method.upper() == "CONNECT":
        return Framing("rest")
    codings = [value for key, value in head.headers if key.lower() == "transfer-encoding"]
    lengths = {value.strip() for key, value in head.headers if key.lower() == "content-length"}
    if codings:
        if lengths or len(codings) != 1 or codings[0].strip().lower() != "chunked":
            raise Unframed("Transfer-Encoding other than a lone `chunked`, or with Content-Length")
        return Framing("chunked")
    if lengths:
        (length,) = lengths if len(lengths) == 1 else (None,)
        if length is None or not (length.isascii() and length.isdigit()) or len(length) > 15:
            raise Unframed("Content-Length is not one decimal number")
        return Framing("length", int(length))
    return Framing("none")


async def judged(gate: Gate | None, head: Head, client: str) -> Decision:
    """The gate's decision on one request of an http tunnel (ours stripped
    from what goes on); without a gate, every request goes on, stripped."""
    if gate is None:
        return Decision(forward=stripped(head, basic=False))
    return await gate.decide(head, client)


def next_requests(
    gate: Callable[[], Gate | None], reader: asyncio.StreamReader, send: Send, first: Framing, client: str
) -> Callable[[Callable[[], None]], Awaitable[None]]:
    """The relay's client side of an http tunnel after its first head: that
    request's body, then each next request judged by the tunnel's gate of
    the moment (`gate`), as the first was."""

    async def forwardable(head: Head) -> Head | None:
        return (await judged(gate(), head, client)).forward

    async def forward(touch: Callable[[], None]) -> None:
        await forward_requests(reader, send, first, forwardable, touch)

    return forward


async def forward_requests(
    reader: asyncio.StreamReader, send: Send, first: Framing, forwardable: Forwardable, touch: Callable[[], None]
) -> None:
    """The body of the first request (already forwarded with `first` its
    framing), then each next request read, judged by `forwardable`, and sent
    with its body, until the client stops sending or a request may not pass.
    Returns with nothing more to forward; IncompleteReadError when the
    client went away in the middle of a request."""
    current = first
    while True:
        if current.kind == "rest":
            while data := await reader.read(CHUNK):
                touch()
                await send(data)
            return
        await copy_body(reader, send, current, touch)
        raw = await next_head(reader)
        if raw is None:
            return
        touch()
        head = parse_head(raw)
        if head is None:
            return
        try:
            current = framing(head)
        except Unframed:
            return
        forward = await forwardable(head)
        if forward is None:
            return
        await send(forward.render())


async def next_head(reader: asyncio.StreamReader) -> bytes | None:
    """The next request's head; None at the end of the client's sending, or
    for a head over the reader's limit. Empty lines before it are skipped
    (RFC 9112 section 2.2)."""
    while True:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return None
        head = raw.lstrip(b"\r\n")
        if head:
            return head


async def copy_body(reader: asyncio.StreamReader, send: Send, frame: Framing, touch: Callable[[], None]) -> None:
    if frame.kind == "length":
        await _copy_exactly(reader, send, frame.length, touch)
    elif frame.kind == "chunked":
        await _copy_chunked(reader, send, touch)


async def _copy_exactly(reader: asyncio.StreamReader, send: Send, count: int, touch: Callable[[], None]) -> None:
    while count > 0:
        data = await reader.read(min(count, CHUNK))
        if not data:
            raise asyncio.IncompleteReadError(b"", count)
        touch()
        count -= len(data)
        await send(data)


async def _copy_chunked(reader: asyncio.StreamReader, send: Send, touch: Callable[[], None]) -> None:
    """Chunks as RFC 9112 section 7.1 writes them, checked strictly (one
    size in hex, an extension of printable characters, CRLF everywhere),
    then the trailers up to their blank line."""
    while True:
        line = await _line(reader)
        match = CHUNK_LINE.fullmatch(line)
        if match is None:
            raise Unframed("a chunk-size line that is not HEX[;extension]CRLF")
        await send(line)
        size = int(match.group(1), 16)
        if size == 0:
            break
        await _copy_exactly(reader, send, size, touch)
        end = await reader.readexactly(2)
        if end != b"\r\n":
            raise Unframed("a chunk not followed by CRLF")
        await send(end)
    total = 0
    while True:
        line = await _line(reader)
        total += len(line)
        if total > TRAILERS_LIMIT:
            raise Unframed("trailers over their limit")
        if line != b"\r\n":
            name, colon, _ = line.partition(b":")
            if not colon or not TOKEN.fullmatch(name) or b"\r" in line[:-2] or b"\n" in line[:-2]:
                raise Unframed("a trailer line that is not a field")
        await send(line)
        if line == b"\r\n":
            return


async def _line(reader: asyncio.StreamReader) -> bytes:
    try:
        line = await reader.readuntil(b"\r\n")
    except asyncio.LimitOverrunError as exc:
        raise Unframed("a line over the reader's limit") from exc
    if len(line) > LINE_LIMIT:
        raise Unframed("a line over its limit")
    return line

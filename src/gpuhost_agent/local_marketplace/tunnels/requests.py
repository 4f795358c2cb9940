"""An HTTP tunnel's client side, request by request (docs/streams.md, "tunnel").

Every request a client sends through an `http` tunnel is read before it is
passed on, so that the gate (basic auth) judges each and our cookies are
stripped from each (local_marketplace/tunnels/auth.py). Until 2026-11-28 only
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
from urllib.parse import urlsplit

from gpuhost_agent.errors import Refusal
from gpuhost_agent.local_marketplace.tunnels.auth import (
    TOKEN_PARAM,
    Decision,
    Gate,
    Head,
    host_name,
    parse_head,
    stripped,
)

CHUNK = 64 * 1024
LINE_LIMIT = 4096  # a chunk-size line or a trailer line
TRAILERS_LIMIT = 64 * 1024
TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a tab is allowed in a field value
CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,15})(;[\x20-\x7e\t]*)?\r\n")
# What a lenient server skips before a request line (Python's str.split() takes
# all of these for whitespace) and the letters of a method: after an upgrade,
# client bytes that start so are read as the next request, not relayed.
SKIPPED = frozenset(b" \t\r\n\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0")
METHOD_LETTERS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
PEEK_LIMIT = 32
OUR_TRAILERS = ("cookie", "authorization")

Send = Callable[[bytes], Awaitable[None]]
Forwardable = Callable[[Head], Awaitable[Head | None]]  # the head to send on, or None: end the connection


class Unframed(Refusal):
    """A request whose body cannot be told apart from the next request."""


@dataclass(frozen=True)
class Framing:
    """How the request's body ends ("none", "length" of `length` bytes,
    "chunked"), and what follows it: "next" (the next request, read),
    "last" (nothing more is forwarded: a request other than HTTP/1.1, sent
    with `Connection: close`), or "switch" (an upgrade or CONNECT: the
    service may speak another protocol from here)."""

    kind: str
    length: int = 0
    then: str = "next"


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
    then = "next"
    if head.version != "HTTP/1.1":
        then = "last"
    elif head.method.upper() == "CONNECT" or (head.get("Upgrade") and "upgrade" in _tokens(head.get("Connection"))):
        then = "switch"
    codings = [value for key, value in head.headers if key.lower() == "transfer-encoding"]
    lengths = {value.strip() for key, value in head.headers if key.lower() == "content-length"}
    if codings:
        if lengths or len(codings) != 1 or codings[0].strip().lower() != "chunked" or then == "last":
            raise Unframed("Transfer-Encoding other than a lone `chunked` in HTTP/1.1, or with Content-Length")
        return Framing("chunked", then=then)
    if lengths:
        (length,) = lengths if len(lengths) == 1 else (None,)
        if length is None or not (length.isascii() and length.isdigit()) or len(length) > 15:
            raise Unframed("Content-Length is not one decimal number")
        return Framing("length", int(length), then=then)
    return Framing("none", then=then)


def _tokens(value: str | None) -> set[str]:
    return {token.strip().lower() for token in (value or "").split(",")}


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
SNIFF_BYTES = 8  # "OPTIONS " and "CONNECT " are the longest method words, with their space
SNIFF_SECONDS = 0.25  # a client that says nothing so long waits for the server to speak first
_REQUEST_START = re.compile(rb"(GET|HEAD|POST|PUT|DELETE|OPTIONS|PATCH|CONNECT|TRACE) ")


async def sniffed(reader: asyncio.StreamReader) -> bytes:
    """A `tcp` tunnel client's first bytes, up to SNIFF_BYTES within
    SNIFF_SECONDS: b"" when it sent fewer in that time (nothing is taken
    from the stream then, and the service may speak first); what it sent
    when it closed sooner."""
    try:
        return await asyncio.wait_for(reader.readexactly(SNIFF_BYTES), SNIFF_SECONDS)
    except asyncio.TimeoutError:
        return b""
    except asyncio.IncompleteReadError as exc:
        return exc.partial


def starts_a_request(first: bytes) -> bool:
    """Do a client's first bytes start an HTTP/1 request line?"""
    return _REQUEST_START.match(first) is not None


def host_problem(head: Head, port: int, tunnel_id: str = "") -> str | None:
    """Why a request's Host is not this tunnel's, or None. A tunnel listens on
    loopback, where a page of any other name reaches it only by DNS
    rebinding (the attacker's name made to resolve to 127.0.0.1, its script
    then same-origin with the tunnel's service): such a request is refused.
    A request without Host (HTTP/1.0) comes from no browser."""
    hosts = [value for name, value in head.headers if name.lower() == "host"]
    if not hosts:
        return None
    names = (*LOOPBACK_NAMES, host_name(tunnel_id)) if tunnel_id else LOOPBACK_NAMES
    if len(hosts) == 1 and hosts[0].strip().lower() in {*names, *(f"{name}:{port}" for name in names)}:
        return None
    return f"this tunnel is http://127.0.0.1:{port}/: a request for another host name is not passed on"


def origin_problem(head: Head, rental_ports: frozenset[int]) -> str | None:
    """Why a browser request may not reach the service, or None. A page's
    requests carry its Origin: a page of the rental's own tunnels (any of its
    ports: a front end on 5173 calling its API on 8000) may drive the service;
    another rental's tunnel on 127.0.0.1 (the same site to a browser, whose
    cookies ignore ports), or any website the renter has open, may not: its
    WebSocket to a terminal or its form to a notebook would act as the renter.
    A request without Origin (a navigation, curl) comes from no other page."""
    origins = [value.strip() for name, value in head.headers if name.lower() == "origin"]
    if not origins:
        return None
    refused = "a page of another origin may not send requests to this tunnel's service"
    if len(origins) != 1:
        return refused
    parts = urlsplit(origins[0])
    try:
        port = parts.port
    except ValueError:
        return refused
    hostname = parts.hostname or ""
    loopback = hostname in {name.strip("[]") for name in LOOPBACK_NAMES} or hostname.endswith(".localhost")
    if parts.scheme == "http" and loopback and port in rental_ports:
        return None
    return refused


def page_refusal(head: Head, port: int, rental_ports: frozenset[int], tunnel_id: str = "") -> Decision | None:
    """The answer to a request whose Host is not the tunnel's (host_problem,
    421) or whose Origin is not a page of the rental's own tunnels
    (origin_problem, 403; `rental_ports`: their listening ports), or None.
    Every request of an `http` tunnel, and a `tcp` tunnel's first one when
    it is HTTP, meet it."""
    if problem := host_problem(head, port, tunnel_id):
        return Decision(status=421, text=problem)
    if problem := origin_problem(head, rental_ports | {port}):
        return Decision(status=403, text=problem)
    return None


async def judged(
    gate: Gate | None,
    head: Head,
    client: str,
    port: int,
    rental_ports: frozenset[int] = frozenset(),
    tunnel_id: str = "",
) -> Decision:
    """The gate's decision on one request of an http tunnel (ours stripped
    from what goes on); without a gate, every request goes on, stripped.
    Before either, the page_refusal of a request not for this tunnel or
    from another rental's page."""
    if refusal := page_refusal(head, port, rental_ports, tunnel_id):
        return refusal
    if gate is None:
        return Decision(forward=stripped(head, basic=False))
    return await gate.decide(head, client)


def next_requests(
    gate: Callable[[], Gate | None],
    reader: asyncio.StreamReader,
    send: Send,
    first: Framing,
    client: str,
    port: int,
    rental_ports: frozenset[int] = frozenset(),
    tunnel_id: str = "",
) -> Callable[[Callable[[], None]], Awaitable[None]]:
    """The relay's client side of an http tunnel after its first head: that
    request's body, then each next request judged by the tunnel's gate of
    the moment (`gate`), as the first was. A sign-in link on a later request
    ends the connection before the gate sees it: the link would be used up
    by a request whose answer (ours) cannot be sent; the client's retry on a
    new connection gets it."""

    async def forwardable(head: Head) -> Head | None:
        if f"{TOKEN_PARAM}=" in head.target:
            return None
        return (await judged(gate(), head, client, port, rental_ports, tunnel_id)).forward

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
    out = _Batched(reader, send)
    try:
        await _forward(reader, out, first, forwardable, touch)
    finally:
        await out.flush()


async def _forward(
    reader: asyncio.StreamReader, out: _Batched, current: Framing, forwardable: Forwardable, touch: Callable[[], None]
) -> None:
    while True:
        await copy_body(reader, out, current, touch)
        prefix = b""
        if current.then == "last":
            await out.flush()
            while await reader.read(CHUNK):  # what follows a closing request is no one's: dropped
                touch()
            return
        if current.then == "switch":
            await out.flush()
            start = await _request_start(reader)
            if start is None:
                return
            if not _starts_a_request(start):
                await _relay_rest(reader, out, start, touch)
                return
            prefix = start
        raw = await next_head(reader, prefix)
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
        await out.add(forward.render())


async def _request_start(reader: asyncio.StreamReader) -> bytes | None:
    """After an upgrade's head: the client's first bytes up to the first
    that tells whether they start a request (what a lenient server skips,
    then letters, then a space). The service answers the upgrade before it
    switches, and an answer other than 101 leaves it reading requests, so
    such bytes are read as one (judged, stripped), never relayed. A
    WebSocket client's first byte is a frame's (0x00-0x0f, 0x80-0x8f,
    with extension bits 0x40-0x4f or 0xc0-0xcf, then a masked length of
    0x80 up), which never does. None at the end of the client's sending."""
    seen = bytearray()
    while len(seen) < PEEK_LIMIT:
        try:
            byte = await reader.readexactly(1)
        except asyncio.IncompleteReadError:
            return bytes(seen) if seen else None
        seen += byte
        if byte[0] in METHOD_LETTERS or (byte[0] in SKIPPED and not bytes(seen).lstrip(bytes(SKIPPED))):
            continue
        return bytes(seen)  # _starts_a_request tells which
    return bytes(seen)


def _starts_a_request(start: bytes) -> bool:
    """Letters after what a lenient server skips, up to a byte it skips or
    the peek's end: read as a request (which, if it is none, ends the
    connection). Any other byte starts the upgraded protocol. One letter
    then 0x85 or 0xa0 is a WebSocket frame's start (extension bits, then a
    masked length of 5 or 32), which no server takes for a method."""
    rest = start.lstrip(bytes(SKIPPED))
    if not rest or rest[-1] in METHOD_LETTERS:
        return bool(rest)
    return rest[-1] in SKIPPED and (len(rest) > 2 or rest[-1] < 0x80)


async def _relay_rest(reader: asyncio.StreamReader, out: _Batched, start: bytes, touch: Callable[[], None]) -> None:
    if start:
        await out.add(start)
        await out.flush()
    while data := await reader.read(CHUNK):
        touch()
        await out.add(data)
        await out.flush()


async def next_head(reader: asyncio.StreamReader, prefix: bytes = b"") -> bytes | None:
    """The next request's head (after `prefix`, its first bytes already
    read); None at the end of the client's sending, or for a head over the
    reader's limit. What a lenient server skips before it is dropped
    (RFC 9112 section 2.2 allows empty lines)."""
    while True:
        try:
            raw = prefix + await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return None
        prefix = b""
        head = raw.lstrip(bytes(SKIPPED))
        if head:
            return head


class _Batched:
    """The client's bytes on their way to the agent, sent as one message
    when the reader has nothing more at hand or CHUNK is reached: a body of
    many tiny chunks, or many tiny pipelined requests, is then a few
    messages, not three per chunk (each message costs both event loops)."""

    def __init__(self, reader: asyncio.StreamReader, send: Send) -> None:
        self._reader, self._send = reader, send
        self._pending = bytearray()

    async def add(self, data: bytes) -> None:
        self._pending += data
        if len(self._pending) >= CHUNK or not _buffered(self._reader):
            await self.flush()

    async def flush(self) -> None:
        if self._pending:
            data, self._pending = bytes(self._pending), bytearray()
            await self._send(data)


def _buffered(reader: asyncio.StreamReader) -> int:
    """How many client bytes the reader holds already read: when none, the
    next read waits, and what is pending goes first. StreamReader keeps them
    in `_buffer` (CPython since 3.4); without it, every add is sent."""
    return len(getattr(reader, "_buffer", b""))


async def copy_body(reader: asyncio.StreamReader, out: _Batched, frame: Framing, touch: Callable[[], None]) -> None:
    if frame.kind == "length":
        await _copy_exactly(reader, out, frame.length, touch)
    elif frame.kind == "chunked":
        await _copy_chunked(reader, out, touch)


async def _copy_exactly(reader: asyncio.StreamReader, out: _Batched, count: int, touch: Callable[[], None]) -> None:
    while count > 0:
        data = await reader.read(min(count, CHUNK))
        if not data:
            raise asyncio.IncompleteReadError(b"", count)
        touch()
        count -= len(data)
        await out.add(data)


async def _copy_chunked(reader: asyncio.StreamReader, out: _Batched, touch: Callable[[], None]) -> None:
    """Chunks as RFC 9112 section 7.1 writes them, checked strictly (one
    size in hex, an extension of printable characters, CRLF everywhere),
    then the trailers up to their blank line; a trailer named like our
    credentials (Cookie, Authorization) is refused, as a head's are stripped."""
    while True:
        line = await _line(reader)
        match = CHUNK_LINE.fullmatch(line)
        if match is None:
            raise Unframed("a chunk-size line that is not HEX[;extension]CRLF")
        await out.add(line)
        size = int(match.group(1), 16)
        if size == 0:
            break
        await _copy_exactly(reader, out, size, touch)
        end = await reader.readexactly(2)
        if end != b"\r\n":
            raise Unframed("a chunk not followed by CRLF")
        await out.add(end)
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
            if name.decode("latin-1").lower() in OUR_TRAILERS:
                raise Unframed(f"a {name.decode('latin-1')} trailer")
        await out.add(line)
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

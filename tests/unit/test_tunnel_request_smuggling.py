"""Request smuggling through a kept-alive http tunnel connection: every
request must pass the gate and the cookie strip. Each test marked
xfail(strict) proves a hole that is still open, and passes once it is fixed.

1. An `Upgrade` header (any value, even empty), a CONNECT, or an HTTP/1.0
   request with keep-alive hands the rest of the connection to the byte
   relay whether or not the service switches protocols. Every common server
   (Go net/http, llhttp without `Connection: upgrade`, h11/uvicorn, nginx)
   answers such a request normally and keeps reading requests, so what
   follows reaches the service unjudged by the gate and with our cookies.
2. Each chunk of a chunked body becomes three messages to the agent (its
   size line, its data, its CRLF): 6 bytes from a client, 3 WebSocket
   messages, so 600 KB of 1-byte chunks keep the marketplace's one event
   loop busy for about 1.6 s (every tunnel and agent channel stalls).
3. A sign-in link (`?gpuhost_token=`) in a later request of a kept-alive
   connection is used by the gate, whose 302 is never sent (the connection
   just ends): the browser retries on a new connection and gets "already used".
4. A target urlsplit cannot read (`//[`) raises ValueError out of
   Gate.decide: the client of a basic-auth tunnel gets no answer and the
   loop logs an unhandled exception for each such connection.
5. The trailers of a chunked request are forwarded as they came: a
   `Cookie: gpuhost_tunnel_*` or `Authorization: Basic` trailer reaches the
   service (Node's req.trailers, Go's Request.Trailer).
"""

from __future__ import annotations

import asyncio
import base64

import pytest

from gpuhost_agent.local_marketplace.tunnels.auth import Head, parse_head, stripped
from gpuhost_agent.local_marketplace.tunnels.requests import Unframed, forward_requests, framing
from tests.unit.test_tunnel_sessions import _entry, _pipelined, book  # noqa: F401  (book: the fixture)

OURS = "gpuhost_tunnel_0123456789abcdef=s1"


def _basic(entry: dict) -> bytes:
    return base64.b64encode(f"{entry['auth']['username']}:{entry['auth']['password']}".encode())


async def _seen(hub, stack_id: str, marker: bytes) -> bytes:
    for _ in range(25):
        if marker in b"".join(hub.received.get(stack_id, [])):
            break
        await asyncio.sleep(0.02)
    return b"".join(hub.received.get(stack_id, []))


# 1 above (fixed)
@pytest.mark.parametrize(
    "first",
    [
        b"GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: anything\r\n",  # no Connection: upgrade, no server switches
        b"GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade:\r\n",  # an empty Upgrade counts as one
        b"GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",  # service answers 404
        b"CONNECT x:443 HTTP/1.1\r\nHost: localhost\r\n",  # h11/uvicorn and Go answer it and read on
        b"GET / HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\nUpgrade: x\r\n",  # 1.0 keep-alive
    ],
)
async def test_a_request_after_an_upgrade_the_service_refused_passes_the_gate(book, first: bytes) -> None:  # noqa: F811
    """Basic-auth tunnel: the first request has the password (and an Upgrade
    header); the second has none, and carries a tunnel session cookie."""
    book, hub, victim, _other = book
    entry = _entry(book, victim)
    await _pipelined(
        entry["port"],
        first + b"Authorization: Basic " + _basic(entry) + b"\r\n\r\n"
        b"GET /sneaked HTTP/1.1\r\nHost: localhost\r\nCookie: " + OURS.encode() + b"\r\n\r\n",
    )
    seen = await _seen(hub, victim, b"/sneaked")
    assert seen, "the first request reached the service"
    assert b"/sneaked" not in seen, f"a request without credentials reached the service: {seen!r}"
    assert b"gpuhost_tunnel" not in seen, seen


async def _forward(client: bytes, first: str) -> list[bytes]:
    """The messages forward_requests sends on for `client`'s bytes after the first head."""
    reader = asyncio.StreamReader(limit=64 * 1024)
    reader.feed_data(client)
    reader.feed_eof()
    sent: list[bytes] = []

    async def send(data: bytes) -> None:
        sent.append(bytes(data))

    async def forwardable(request: Head) -> Head | None:
        return stripped(request, basic=True)

    parsed = parse_head(first.encode())
    assert parsed is not None
    try:
        await forward_requests(reader, send, framing(parsed), forwardable, lambda: None)
    except Unframed:
        pass
    return sent


# 2 above (fixed)
async def test_many_tiny_chunks_are_not_one_agent_message_each() -> None:
    chunks = 10_000
    client = b"1\r\na\r\n" * chunks + b"0\r\n\r\n"
    sent = await _forward(client, "POST /upload HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert b"".join(sent) == client, "the body passes byte for byte"
    # 60 KB arrived in one read: the old byte relay sent it as one message. Now 30 001.
    assert len(sent) <= 64, f"{len(client)} bytes from the client became {len(sent)} messages to the agent"


# 3 above (fixed)
async def test_a_sign_in_link_on_a_kept_alive_connection_still_signs_in(book) -> None:  # noqa: F811
    book, hub, victim, _other = book
    entry = _entry(book, victim)
    link = entry["auth"]["link"]
    target = link[link.index("/?") :]
    # The renter's browser, already let in, opens a fresh sign-in link on its kept-alive connection.
    reader, writer = await asyncio.open_connection("127.0.0.1", entry["port"])
    writer.write(
        b"GET /tree HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic " + _basic(entry) + b"\r\n\r\n"
        b"GET " + target.encode() + b" HTTP/1.1\r\nHost: localhost\r\n\r\n"
    )
    await writer.drain()
    writer.write_eof()
    answered = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert b"signed in" not in answered, "our sign-in page is never put among the service's answers"
    # The browser retries the link on a new connection, as it does when a reused one closes unanswered.
    reader, writer = await asyncio.open_connection("127.0.0.1", entry["port"])
    writer.write(b"GET " + target.encode() + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
    await writer.drain()
    retried = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert retried.startswith(b"HTTP/1.1 200") and b"signed in" in retried, (
        f"the link was used by a request nobody answered: {retried[:80]!r}"
    )


# 4 above (fixed)
async def test_a_target_urlsplit_refuses_gets_an_answer_not_an_exception(book) -> None:  # noqa: F811
    book, _hub, victim, _other = book
    entry = _entry(book, victim)
    loop = asyncio.get_running_loop()
    unhandled: list[dict] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", entry["port"])
        writer.write(b"GET //[ HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await writer.drain()
        try:
            answer = await asyncio.wait_for(reader.read(), 5)
        except ConnectionError:
            answer = b"(reset)"
        writer.close()
        await asyncio.sleep(0.05)
    finally:
        loop.set_exception_handler(previous)
    assert not unhandled, f"an exception escaped the tunnel: {unhandled[0].get('exception')!r}"
    assert answer.startswith(b"HTTP/1.1 4"), answer


# 5 above (fixed)
async def test_trailers_carry_neither_our_cookie_nor_our_basic_credentials() -> None:
    client = (
        b"3\r\nabc\r\n0\r\n" + f"Cookie: {OURS}\r\n".encode() + b"Authorization: Basic cmVudGVyOnNlY3JldA==\r\n\r\n"
    )
    sent = b"".join(await _forward(client, "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"))
    assert b"abc" in sent
    assert b"gpuhost_tunnel" not in sent and b"Authorization: Basic" not in sent, sent

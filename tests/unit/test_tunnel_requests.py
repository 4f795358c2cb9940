"""An http tunnel's requests on a kept-alive connection
(local_marketplace/tunnels/requests.py): each is framed as HTTP/1.1 frames
it, judged and stripped; whatever two parsers could frame two ways is never
forwarded (request smuggling past the gate and the cookie strip)."""

from __future__ import annotations

import asyncio

import pytest

from gpuhost_agent.local_marketplace.tunnels.auth import Head, parse_head, stripped
from gpuhost_agent.local_marketplace.tunnels.requests import Framing, Unframed, forward_requests, framing

OURS = "gpuhost_tunnel_0123=session"


def head(text: str) -> Head:
    parsed = parse_head(text.replace("\n", "\r\n").encode() + b"\r\n\r\n")
    assert parsed is not None
    return parsed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("GET / HTTP/1.1\nHost: x", Framing("none")),
        ("POST / HTTP/1.1\nContent-Length: 12", Framing("length", 12)),
        ("POST / HTTP/1.1\nContent-Length: 12\nContent-Length: 12", Framing("length", 12)),
        ("POST / HTTP/1.1\nTransfer-Encoding: Chunked", Framing("chunked")),
        ("GET /ws HTTP/1.1\nUpgrade: websocket\nConnection: keep-alive, Upgrade", Framing("none", then="switch")),
        ("GET /ws HTTP/1.1\nUpgrade: websocket", Framing("none")),  # no `upgrade` token: no server switches
        ("CONNECT host:443 HTTP/1.1", Framing("none", then="switch")),
        ("GET / HTTP/1.0\nContent-Length: 3", Framing("length", 3, then="last")),
    ],
)
def test_framing_as_http11_reads_it(text: str, expected: Framing) -> None:
    assert framing(head(text)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "POST / HTTP/1.1\nContent-Length: 5\nTransfer-Encoding: chunked",  # CL.TE / TE.CL
        "POST / HTTP/1.1\nTransfer-Encoding: gzip, chunked",
        "POST / HTTP/1.1\nTransfer-Encoding: chunked\nTransfer-Encoding: chunked",
        "POST / HTTP/1.1\nTransfer-Encoding: xchunked",
        "POST / HTTP/1.1\nContent-Length: 5\nContent-Length: 6",
        "POST / HTTP/1.1\nContent-Length: +5",
        "POST / HTTP/1.1\nContent-Length: 0x5",
        "POST / HTTP/1.1\nContent-Length: ５",  # a digit to str.isdigit, not to a service
        "POST / HTTP/1.1\nTransfer-Encoding : chunked",  # the name keeps no space before its colon
        "POST / HTTP/1.1\nX-A: 1\x0bTransfer-Encoding: chunked",
        "POST / HTTP/1.1\nX-A: 1\x00",
        "GET /a\x0bb HTTP/1.1",
    ],
)
def test_what_two_parsers_could_frame_two_ways_is_refused(text: str) -> None:
    parsed = parse_head(text.replace("\n", "\r\n").encode("utf-8") + b"\r\n\r\n")
    if parsed is not None:  # parse_head already refuses some
        with pytest.raises(Unframed):
            framing(parsed)


def test_a_bare_lf_in_a_value_is_refused() -> None:
    raw = b"POST / HTTP/1.1\r\nX-A: 1\nTransfer-Encoding: chunked\r\nHost: x\r\n\r\n"
    parsed = parse_head(raw)
    assert parsed is not None
    with pytest.raises(Unframed):
        framing(parsed)


async def relay(client: bytes, first: str, refuse: str | None = None) -> tuple[bytes, list[str]]:
    """What forward_requests sends on for `client`'s bytes after the first
    head (`first`, already sent), and the targets it judged."""
    reader = asyncio.StreamReader(limit=64 * 1024)
    reader.feed_data(client)
    reader.feed_eof()
    sent: list[bytes] = []
    judged: list[str] = []

    async def send(data: bytes) -> None:
        sent.append(bytes(data))

    async def forwardable(request: Head) -> Head | None:
        judged.append(request.target)
        return None if refuse is not None and request.target == refuse else stripped(request, basic=False)

    try:
        await forward_requests(reader, send, framing(head(first)), forwardable, lambda: None)
    except Unframed:
        pass
    return b"".join(sent), judged


async def test_each_request_of_a_kept_alive_connection_is_judged_and_stripped() -> None:
    client = (
        b"hello"  # the first request's body (Content-Length: 5)
        + f"POST /b HTTP/1.1\r\nCookie: {OURS}; app=1\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        + b"3;x=y\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n"
        + f"\r\nGET /c HTTP/1.1\r\nCookie: {OURS}\r\n\r\n".encode()
    )
    sent, judged = await relay(client, "POST /a HTTP/1.1\nContent-Length: 5")
    assert judged == ["/b", "/c"]
    assert sent.startswith(b"hello" + b"POST /b HTTP/1.1\r\nCookie: app=1\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert b"3;x=y\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\nGET /c HTTP/1.1\r\n\r\n" in sent
    assert b"gpuhost_tunnel" not in sent


async def test_a_request_hidden_in_a_body_stays_body() -> None:
    """A body is forwarded as the service frames it: the GET inside the
    chunk is data to both, and is not judged (nor passed as a request)."""
    hidden = f"GET /admin HTTP/1.1\r\nCookie: {OURS}\r\n\r\n".encode()
    client = f"{len(hidden):x}\r\n".encode() + hidden + b"\r\n0\r\n\r\n"
    sent, judged = await relay(client, "POST /a HTTP/1.1\nTransfer-Encoding: chunked")
    assert judged == [] and sent == client


@pytest.mark.parametrize(
    "second",
    [
        b"POST /x HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nabcde\r\n0\r\n\r\n",  # bare LF chunk line
        b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nabcde\r\n0\r\n\r\n",
        b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXX0\r\n\r\n",  # no CRLF after data
        b"not a request at all\r\n\r\n",
    ],
)
async def test_a_smuggling_shape_ends_forwarding_before_its_bytes(second: bytes) -> None:
    after = f"GET /smuggled HTTP/1.1\r\nCookie: {OURS}\r\n\r\n".encode()
    sent, _ = await relay(second + after, "GET /a HTTP/1.1")
    assert b"/smuggled" not in sent and b"gpuhost_tunnel" not in sent
    assert b"Content-Length: 4\r\nTransfer-Encoding" not in sent


async def test_a_request_the_gate_refuses_ends_the_connection() -> None:
    client = b"GET /no HTTP/1.1\r\n\r\nGET /later HTTP/1.1\r\n\r\n"
    sent, judged = await relay(client, "GET /a HTTP/1.1", refuse="/no")
    assert judged == ["/no"] and sent == b""


async def test_an_upgrade_hands_the_rest_to_the_byte_relay() -> None:
    upgrade = "GET /ws HTTP/1.1\nUpgrade: websocket\nConnection: Upgrade"
    frames = b"\x81\x85masks" + b"GET / HTTP/1.1\r\n\r\n"  # a masked text frame, whatever it carries
    sent, judged = await relay(frames, upgrade)
    assert sent == frames and judged == []
    compressed = b"\x41\x85masks"  # a first fragment with permessage-deflate's bit: 'A', then a masked length
    assert (await relay(compressed, upgrade))[0] == compressed


@pytest.mark.parametrize("start", [b"", b"\r\n", b" ", b"\x0b", b"\t\x1c"])
async def test_after_an_upgrade_bytes_that_start_a_request_are_judged_as_one(start: bytes) -> None:
    """The service may have refused the upgrade and still read requests;
    what a lenient server would take for one is read, judged, stripped."""
    upgrade = "GET /ws HTTP/1.1\nUpgrade: websocket\nConnection: Upgrade"
    client = start + f"GET /next HTTP/1.1\r\nCookie: {OURS}\r\n\r\n".encode()
    sent, judged = await relay(client, upgrade)
    assert judged == ["/next"] and sent == b"GET /next HTTP/1.1\r\n\r\n"
    sent, judged = await relay(b"X" * 40 + b" /long HTTP/1.1\r\n\r\n", upgrade)
    assert judged == ["/long"], "a long method is still a request"


async def test_after_a_request_other_than_http11_nothing_more_is_forwarded() -> None:
    sent, judged = await relay(
        b"abc" + f"GET /next HTTP/1.1\r\nCookie: {OURS}\r\n\r\n".encode(), "POST / HTTP/1.0\nContent-Length: 3"
    )
    assert sent == b"abc" and judged == []


async def test_a_client_gone_in_the_middle_of_a_body_is_an_incomplete_read() -> None:
    with pytest.raises(asyncio.IncompleteReadError):
        await relay(b"abc", "POST /a HTTP/1.1\nContent-Length: 10")

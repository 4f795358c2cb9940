"""The tunnels' sign-in sessions,
through the real TunnelBook listeners on 127.0.0.1, with a fake agent channel
that records what each stack's "container" receives and answers 200.

What an attacker could do, each test failing before the fix:

1. The session cookie a sign-in link set (`gpuhost_tunnel`, Path=/, one name
   for every tunnel) is scoped by host only: cookies do not isolate ports
   (RFC 6265 section 8.5), and every tunnel is 127.0.0.1:<port>. A browser
   signed in to stack A's basic-auth tunnel sent A's session to every other
   tunnel of the host, and a tunnel without basic auth relayed the Cookie
   header verbatim to its container (another rental's image). Now the cookie
   is the tunnel's own (`gpuhost_tunnel_<tunnelId>`), every http tunnel
   strips every `gpuhost_tunnel*` cookie, and a session is its tunnel's alone.
2. A new stack password (POST .../tunnel-password) did not end a connection
   already let through: an upgraded (WebSocket) connection relayed on.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import WSMessage, WSMsgType
from support.browser_names import browser_session
from yarl import URL

from gpuhost_agent.local_marketplace.channel_hub import ChannelHub
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.local_marketplace.tunnels import auth as tunnel_auth
from gpuhost_agent.local_marketplace.tunnels import relay as tunnel_relay
from gpuhost_agent.local_marketplace.tunnels.book import TunnelBook
from gpuhost_agent.protocol import wire, wire_time

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


class FakeWS:
    """The agent's side of one stream: records what the client sent, answers 200."""

    def __init__(self, sink: list[bytes], answer: bool) -> None:
        self.sink, self.queue = sink, asyncio.Queue()
        self.own: list[bytes] = []
        if answer:
            self.queue.put_nowait(WSMessage(WSMsgType.BINARY, ANSWER, None))
            self.queue.put_nowait(WSMessage(WSMsgType.TEXT, tunnel_relay.EOF_MESSAGE, None))

    async def send_bytes(self, data: bytes) -> None:
        self.sink.append(bytes(data))
        self.own.append(bytes(data))

    async def send_str(self, _data: str) -> None:
        return None

    async def receive(self) -> WSMessage:
        return await self.queue.get()

    async def close(self, *args, **kwargs) -> None:
        return None


class FakeHub(ChannelHub):
    """Every stream opens; each stack's container records its bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.received: dict[str, list[bytes]] = {}
        self.answer = True
        self.streams: list[list[bytes]] = []  # what each stream received, in the order they opened

    async def open(self, kind: str, rental_id: str, fields: dict):  # type: ignore[override]
        sink = self.received.setdefault(str(fields.get("stackId")), [])
        stream = FakeWS(sink, self.answer)
        self.streams.append([])
        stream.own = self.streams[-1]
        return SimpleNamespace(agent_ws=stream, ended=asyncio.Event())

    async def finish(self, stream, code=None, message=b"") -> None:  # type: ignore[override]
        return None


def _stack(store: Store, port: int, *, basic_auth: bool, ports: tuple[int, ...] = ()) -> str:
    rental = store.create_rental(name="r", gpu_count=0, end_date=None)
    template = {"name": "n", "description": "d", "content": "services: {}\n", "environmentVariables": {}}
    stack = store.create_stack(rental["rentalId"], {**template, "isBasicAuthEnabled": basic_auth})
    stack["status"] = wire.APPLIED
    container = {
        "Id": (stack["stackId"].replace("-", "") * 3)[:64],
        "Name": f"p{port}-web-1",
        "State": "running",
        "Labels": ["com.docker.compose.service=web"],
        "Ports": [{"PrivatePort": p, "Type": "tcp"} for p in (port, *ports)],
    }
    store.containers[stack["stackId"]] = {"observedAt": wire_time.iso(), "containers": [container]}
    return stack["stackId"]


@asynccontextmanager
async def _serving(
    tmp_path, *stacks: tuple[int, bool, tuple[int, ...]]
) -> AsyncIterator[tuple[TunnelBook, FakeHub, list[str]]]:
    """The real TunnelBook's listeners over a fresh store holding `stacks`, each
    (port, basic_auth, more ports) as _stack takes them: (book, hub, stack ids)."""
    store = Store.load_or_create(tmp_path / "market.json")
    hub = FakeHub()
    ids = [_stack(store, port, basic_auth=basic_auth, ports=ports) for port, basic_auth, ports in stacks]
    book = TunnelBook(store, hub)
    await book.sync()
    try:
        yield book, hub, ids
    finally:
        await book.close_all()


@pytest.fixture
async def book(tmp_path):
    # a renter's Jupyter, behind basic auth; another rental's web service: an image it chose
    async with _serving(tmp_path, (8888, True, ()), (8080, False, ())) as (book, hub, (victim, other)):
        yield book, hub, victim, other


def _entry(book: TunnelBook, stack_id: str) -> dict:
    (entry,) = book.for_stack(stack_id)
    return entry


SESSION = re.compile(rb"gpuhost_tunnel[A-Za-z0-9_]*=([A-Za-z0-9_-]+)")


async def test_a_tunnel_session_does_not_reach_another_stacks_tunnel_nor_replay_there(book) -> None:
    book, hub, victim, other = book
    link = _entry(book, victim)["auth"]["link"]
    jar = aiohttp.CookieJar(unsafe=True)  # unsafe: cookies for an IP host, as a browser keeps them
    async with browser_session(cookie_jar=jar) as browser:
        async with browser.get(link, allow_redirects=False) as signed_in:
            cookie = f"gpuhost_tunnel_{_entry(book, victim)['tunnelId']}="
            assert signed_in.status == 200 and signed_in.headers["Set-Cookie"].startswith(cookie)
        async with browser.get(_entry(book, victim)["url"], headers={"Cookie": "theirs=1"}) as own:
            assert own.status == 200  # the renter's own use: fine
        assert b"theirs=1" in hub.received[victim][-1], "the service's own cookies pass"
        assert not SESSION.search(b"".join(hub.received[victim])), "nor does its own container see the session"
        async with browser.get(_entry(book, other)["url"]) as elsewhere:  # the renter opens another tunnel
            assert elsewhere.status == 200
    seen = b"".join(hub.received.get(other, []))
    stolen = SESSION.search(seen)
    # The hole was: the other stack's container got the victim's session
    assert b"GET / HTTP/1.1" in seen and stolen is None, (
        f"another stack's container received the session: {seen[:200]!r}"
    )


async def test_a_session_is_its_tunnels_alone(tmp_path) -> None:
    """A session is a bearer credential scoped to one tunnel: the same stack's
    other basic-auth tunnel (same password) refuses it under either name."""
    async with _serving(tmp_path, (8888, True, (6006,))) as (book, hub, (stack,)):
        jupyter, board = sorted(book.for_stack(stack), key=lambda entry: entry["containerPort"], reverse=True)
        assert (jupyter["containerPort"], board["containerPort"]) == (8888, 6006)
        async with browser_session() as browser:
            async with browser.get(jupyter["auth"]["link"], allow_redirects=False) as signed_in:
                name, _, rest = signed_in.headers["Set-Cookie"].partition("=")
                assert name == f"gpuhost_tunnel_{jupyter['tunnelId']}", "named after its tunnel"
                session = rest.partition(";")[0]
            for as_name in (name, f"gpuhost_tunnel_{board['tunnelId']}"):
                async with browser.get(board["url"], headers={"Cookie": f"{as_name}={session}"}) as other:
                    assert other.status == 401, f"tunnel B took tunnel A's session as {as_name}"
            async with browser.get(jupyter["url"], headers={"Cookie": f"{name}={session}"}) as own:
                assert own.status == 200, "the session opens its own tunnel"
        assert not SESSION.search(b"".join(b"".join(sink) for sink in hub.received.values()))


async def test_a_new_password_ends_an_upgraded_connection(book) -> None:
    book, hub, victim, _ = book
    entry = _entry(book, victim)
    hub.answer = False  # the service keeps the upgraded connection open
    reader, writer = await asyncio.open_connection("127.0.0.1", entry["port"])

    basic = base64.b64encode(f"{entry['auth']['username']}:{entry['auth']['password']}".encode()).decode()
    writer.write(
        (
            f"GET /api/kernels/1/channels HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {basic}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        ).encode()
    )
    await writer.drain()
    for _ in range(50):
        if hub.received.get(victim):
            break
        await asyncio.sleep(0.02)
    assert hub.received[victim], "the upgraded request reached the service"
    # The renter revokes access: POST .../tunnel-password, as tunnel_password_api.py does it.
    store = book.store
    rental_id = store.stacks[victim]["rentalId"]
    generation, plain = store.next_tunnel_password(rental_id, victim)
    store.set_tunnel_password(rental_id, victim, generation, tunnel_auth.hash_password(plain))
    await book.sync()
    before = len(hub.received[victim])
    writer.write(b"after-revocation-frame")
    await writer.drain()
    await asyncio.sleep(0.3)
    after = b"".join(hub.received[victim][before:])
    assert b"after-revocation-frame" not in after, "the old credential's connection still reaches the service"
    assert await asyncio.wait_for(reader.read(), 2) == b"", "the tunnel closed the connection"
    writer.close()


async def test_a_tunnel_without_basic_auth_strips_our_cookies_and_upgrades(book) -> None:
    """Every http tunnel reads its first request's head to strip our cookies,
    keeping the service's own Authorization, and a WebSocket upgrade still
    relays on, bytes both ways, after the head."""
    book, hub, _victim, other = book
    hub.answer = False
    entry = _entry(book, other)
    reader, writer = await asyncio.open_connection("127.0.0.1", entry["port"])
    writer.write(
        b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer app-token\r\n"
        b"Cookie: gpuhost_tunnel_0123456789abcdef=s1; app=2; gpuhost_tunnel=s2\r\n"
        b"Upgrade: websocket\r\nConnection: Upgrade\r\n\r\nframe-1"
    )
    await writer.drain()
    for _ in range(50):
        if b"frame-1" in b"".join(hub.received.get(other, [])):
            break
        await asyncio.sleep(0.02)
    seen = b"".join(hub.received[other])
    writer.close()
    assert seen.startswith(b"GET /ws HTTP/1.1\r\n") and b"frame-1" in seen, seen
    assert b"Authorization: Bearer app-token" in seen and b"app=2" in seen and b"Connection: Upgrade" in seen
    assert b"gpuhost_tunnel" not in seen, seen


async def _pipelined(port: int, requests: bytes) -> bytes:
    """`requests` written at once on one connection, which is then read to its end: what came back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(requests)
    await writer.drain()
    writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


async def test_a_kept_alive_connection_is_one_stream_and_each_request_is_stripped(book) -> None:
    """Two requests on one connection of a tunnel without basic auth: one
    stream through the agent, our cookie stripped from both."""
    book, hub, _victim, other = book
    ours = b"Cookie: gpuhost_tunnel_0123456789abcdef=s1; app=2\r\n"
    await _pipelined(
        _entry(book, other)["port"],
        b"GET /one HTTP/1.1\r\nHost: localhost\r\n"
        + ours
        + b"\r\nGET /two HTTP/1.1\r\nHost: localhost\r\n"
        + ours
        + b"\r\n",
    )
    for _ in range(50):
        if b"/two" in b"".join(hub.received.get(other, [])):
            break
        await asyncio.sleep(0.02)
    seen = b"".join(hub.received[other])
    (stream,) = [b"".join(own) for own in hub.streams if b"GET /one" in b"".join(own)]
    assert b"GET /two" in stream, f"the second request came on another stream: {stream!r}"
    assert b"gpuhost_tunnel" not in seen and seen.count(b"app=2") == 2


async def test_a_later_request_without_credentials_never_reaches_a_basic_auth_service(book) -> None:
    book, hub, victim, _other = book
    entry = _entry(book, victim)
    basic = base64.b64encode(f"{entry['auth']['username']}:{entry['auth']['password']}".encode())
    await _pipelined(
        entry["port"],
        b"GET /allowed HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic " + basic + b"\r\n\r\n"
        b"GET /sneaked HTTP/1.1\r\nHost: localhost\r\n\r\n"
        b"GET /after HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic " + basic + b"\r\n\r\n",
    )
    await asyncio.sleep(0.3)
    seen = b"".join(hub.received[victim])
    assert b"GET /allowed" in seen, seen
    assert b"/sneaked" not in seen and b"/after" not in seen, "the gate's refusal ends the connection"


async def test_every_port_of_a_basic_auth_stack_is_gated(tmp_path) -> None:
    """A basic-auth stack's port outside the usual web ports (a second
    Jupyter on 8889) was a `tcp` tunnel with no gate: it answered without credentials."""
    async with _serving(tmp_path, (8888, True, (8889,))) as (book, hub, (stack_id,)):
        entries = {entry["containerPort"]: entry for entry in book.for_stack(stack_id)}
        assert {port: entry["protocol"] for port, entry in entries.items()} == {8888: "http", 8889: "http"}
        assert entries[8889]["auth"] is not None
        answer = await _pipelined(entries[8889]["port"], b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 401"), answer
        assert not hub.received.get(stack_id), "nothing reached the service without credentials"


async def test_a_request_naming_another_host_is_refused_dns_rebinding(book) -> None:
    """A page of the attacker's name made to resolve to 127.0.0.1 is
    same-origin with an ungated tunnel's service; its requests carry its Host."""
    book, hub, _victim, other = book
    port = _entry(book, other)["port"]
    for host in (
        b"evil.example:" + str(port).encode(),
        b"127.0.0.1:1",
        b"localhost:" + str(port).encode() + b"\r\nHost: x",
    ):
        answer = await _pipelined(port, b"GET /rebound HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 421"), (host, answer)
    assert b"/rebound" not in b"".join(hub.received.get(other, []))
    answer = await _pipelined(port, b"GET /own HTTP/1.1\r\nHost: 127.0.0.1:" + str(port).encode() + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200"), answer
    # A later request on a kept-alive connection is judged the same: the connection ends there.
    await _pipelined(
        port,
        b"GET /first HTTP/1.1\r\nHost: localhost\r\n\r\nGET /second HTTP/1.1\r\nHost: evil.example\r\n\r\n",
    )
    await asyncio.sleep(0.2)
    seen = b"".join(hub.received[other])
    assert b"/first" in seen and b"/second" not in seen


async def test_a_page_of_another_rentals_tunnel_or_of_a_website_cannot_drive_a_service(book) -> None:
    """127.0.0.1:P1 and 127.0.0.1:P2 are the same site to a browser, so a
    hostile image's page on another rental's tunnel (or any website) could open a WebSocket
    to a terminal or post to a notebook of the renter's; its requests carry its Origin."""
    book, hub, victim, other = book
    port, foreign = _entry(book, other)["port"], _entry(book, victim)["port"]  # victim: another rental
    for origin in (f"http://127.0.0.1:{foreign}", "https://evil.example", "null", f"http://evil.example:{port}"):
        request = f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {origin}\r\nUpgrade: websocket\r\n\r\n"
        answer = await _pipelined(port, request.encode())
        assert answer.startswith(b"HTTP/1.1 403"), (origin, answer)
    assert b"/ws" not in b"".join(hub.received.get(other, []))
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):  # its own pages
        answer = await _pipelined(
            port,
            f"POST /own HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {origin}\r\nContent-Length: 0\r\n\r\n".encode(),
        )
        assert answer.startswith(b"HTTP/1.1 200"), (origin, answer)


async def test_a_page_of_the_rentals_other_tunnel_may_call_it(tmp_path) -> None:
    """A front end on one port calling its API on another port of the same rental passes."""
    async with _serving(tmp_path, (5173, False, (8000,))) as (book, hub, (stack_id,)):
        entries = {entry["containerPort"]: entry for entry in book.for_stack(stack_id)}
        front, api = entries[5173]["port"], entries[8000]["port"]
        answer = await _pipelined(
            api, f"GET /api HTTP/1.1\r\nHost: 127.0.0.1:{api}\r\nOrigin: http://127.0.0.1:{front}\r\n\r\n".encode()
        )
        assert answer.startswith(b"HTTP/1.1 200"), answer


async def test_a_browsers_session_never_goes_to_another_rentals_tcp_tunnel(tmp_path) -> None:
    """A browser signed in to a basic-auth tunnel sent its session cookie
    to every port of 127.0.0.1, a `tcp` tunnel of another rental's too, which reads nothing
    to strip it from; the value replayed at the victim's tunnel let the thief in. The session
    now lives under the tunnel's own host name (`<tunnel id>.localhost`), host-only, Strict."""
    # the thief: another rental's raw TCP service on 9000 (an image it chose)
    async with _serving(tmp_path, (8888, True, ()), (9000, False, ())) as (book, hub, (victim, thief)):
        entry, raw = _entry(book, victim), _entry(book, thief)
        assert raw["protocol"] == "tcp" and entry["url"] == f"http://{entry['tunnelId']}.localhost:{entry['port']}/"
        async with browser_session(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
            async with browser.get(entry["auth"]["link"]) as signed_in:
                assert signed_in.status == 200 and "Domain" not in signed_in.headers["Set-Cookie"]
                assert "SameSite=Strict" in signed_in.headers["Set-Cookie"]
            async with browser.get(entry["url"]) as own:
                assert own.status == 200, "the session opens its own tunnel"
            reader, writer = await asyncio.open_connection("127.0.0.1", raw["port"])  # what the browser sends there
            cookies = browser.cookie_jar.filter_cookies(URL(f"http://127.0.0.1:{raw['port']}/"))
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            writer.write(b"".join(f"Cookie: {m.key}={m.value}\r\n".encode() for m in cookies.values()) + b"\r\n")
            await writer.drain()
            writer.close()
        assert not cookies, f"the browser would send {list(cookies)} to another rental's tcp tunnel"


async def test_an_http_request_on_a_tcp_tunnel_meets_the_host_and_origin_checks(tmp_path) -> None:
    """A `tcp` tunnel read nothing, so DNS rebinding reached an HTTP
    service on one (Ollama on 11434). A client whose first bytes start an HTTP request
    has its head judged as an `http` tunnel's is; other bytes, and a client that waits
    for the service to speak first, pass as before."""
    async with _serving(tmp_path, (11434, False, ())) as (book, hub, (stack_id,)):
        entry = _entry(book, stack_id)
        port = entry["port"]
        assert entry["protocol"] == "tcp"
        rebound = await _pipelined(port, f"GET /api/tags HTTP/1.1\r\nHost: evil.example:{port}\r\n\r\n".encode())
        assert rebound.startswith(b"HTTP/1.1 421"), rebound
        foreign = f"POST /api/pull HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: https://evil.example\r\n\r\n"
        assert (await _pipelined(port, foreign.encode())).startswith(b"HTTP/1.1 403")
        assert not hub.received.get(stack_id), "neither reached the service"
        own = await _pipelined(port, f"GET /api/tags HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        assert own.startswith(b"HTTP/1.1 200") and b"GET /api/tags" in b"".join(hub.received[stack_id])
        await _pipelined(port, b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03")  # a TLS hello: bytes, relayed
        assert b"\x16\x03\x01\x00\xa5" in b"".join(hub.received[stack_id])
        opened = len(hub.streams)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # a client waiting for a banner
        await asyncio.sleep(0.6)
        assert len(hub.streams) == opened + 1, "the stream opens although the client said nothing"
        writer.close()

"""The marketplace's side of live streams (docs/streams.md, sections 2 to 4), over
real HTTP and real WebSockets on loopback. The test plays the agent: it opens
the channel with the environment's key, reads the requests, and answers them
by opening /agent/streams/{streamId} (or refusing), as the real agent does.
No Docker is needed."""

from __future__ import annotations

import asyncio
import json
import struct
import time

import aiohttp
import pytest
from support.openapi_check import AGENT_DOC, LOCAL_DOC, check_named, load
from support.stacks import TEMPLATE

from gpuhost_agent.common import logs
from gpuhost_agent.local_marketplace import channel_api, channel_hub, server, terminal_tickets
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import wire, wire_time

CONTAINER_ID = "4c01db0b339c4a4e0b5e9d0b1f4e8c6f0a7b9d2e3f4a5b6c7d8e9f0a1b2c3d4e"
AGENT_DOC_LOADED = load(AGENT_DOC)


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(payload)) + payload


def container(name: str, container_id: str) -> dict:
    return {"Name": name, "Id": container_id, "Created": 1, "Labels": [], "Ports": [], "State": "running"}


class World:
    """A running marketplace with one rental, one stack and its pushed container list."""

    def __init__(self, http: aiohttp.ClientSession, running: server.RunningMarketplace):
        self.http, self.running, self.state = http, running, running.state
        self.base = running.base_url
        self.renter = {wire.API_KEY_HEADER: self.state.store.renterApiKey}
        self.agent_key = {wire.API_KEY_HEADER: self.state.store.envApiKey}
        self.sockets: list[aiohttp.ClientWebSocketResponse] = []  # the agent's, closed at teardown

    async def call(self, method: str, path: str, body=None, headers=None):
        async with self.http.request(method, self.base + path, json=body, headers=headers or self.renter) as response:
            return response.status, await response.json(content_type=None)

    async def stack_with_container(self, name: str = "web-1", container_id: str = CONTAINER_ID):
        status, rental = await self.call("POST", "/rentals", {"envId": self.state.store.envId})
        assert status == 201
        status, stack_id = await self.call("POST", f"/rentals/{rental['rentalId']}/stacks", {"template": TEMPLATE})
        assert status == 201
        status, _ = await self.call(
            "PUT",
            f"/agent/stacks/{stack_id}/containers",
            {"containers": [container(name, container_id)], "observedAt": wire_time.iso()},
            self.agent_key,
        )
        assert status == 200
        return rental["rentalId"], stack_id

    def logs_url(self, rental_id: str, stack_id: str, container_ref: str = CONTAINER_ID) -> str:
        return f"{self.base}/rentals/{rental_id}/stacks/{stack_id}/containers/{container_ref}/logs"

    async def agent(self, session: str | None = None) -> ScriptedAgent:
        agent = ScriptedAgent(self)
        await agent.connect(session)
        return agent


class ScriptedAgent:
    def __init__(self, world: World):
        self.world = world
        self.channel: aiohttp.ClientWebSocketResponse | None = None

    def headers(self, session: str | None = None) -> dict:
        return {**self.world.agent_key, **({wire.SESSION_HEADER: session} if session else {})}

    async def connect(self, session: str | None = None) -> None:
        self.channel = await self.world.http.ws_connect(
            self.world.base + "/agent/channel", headers=self.headers(session)
        )
        self.world.sockets.append(self.channel)
        await until(lambda: self.world.state.streams.connected)

    async def request(self, timeout: float = 5.0) -> dict:
        message = await self.channel.receive(timeout)
        assert message.type is aiohttp.WSMsgType.TEXT, message
        return json.loads(message.data)

    async def nothing_asked(self, seconds: float = 0.3) -> None:
        with pytest.raises(asyncio.TimeoutError):
            await self.channel.receive(seconds)

    async def open_stream(self, stream_id: str, heartbeat: float | None = None) -> aiohttp.ClientWebSocketResponse:
        stream = await self.world.http.ws_connect(
            f"{self.world.base}/agent/streams/{stream_id}", headers=self.headers(), heartbeat=heartbeat
        )
        self.world.sockets.append(stream)
        return stream


async def until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def world(tmp_path):
    store = Store.load_or_create(tmp_path / "m.json", "renter-key")
    running = await server.start(MarketplaceState(store), "127.0.0.1", 0)
    running.state.streams.answer_timeout = 1.0
    running.state.streams.stream_keepalive = 0.1
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:  # a bug fails, not hangs
        world = World(http, running)
        yield world
        await asyncio.gather(*(asyncio.wait_for(ws.close(), 2) for ws in world.sockets), return_exceptions=True)
    await running.stop()


async def handshake_status(coroutine) -> int:
    with pytest.raises(aiohttp.WSServerHandshakeError) as failed:
        await coroutine
    return failed.value.status


# ---- logs ---------------------------------------------------------------------------


async def test_logs_are_relayed_byte_exact(world):
    rental_id, stack_id = await world.stack_with_container()
    agent = await world.agent()
    params = {"tail": "10", "since": "2024-01-01T00:00:00Z", "timestamps": "true"}
    renter = asyncio.create_task(
        world.http.get(world.logs_url(rental_id, stack_id, "web-1"), headers=world.renter, params=params)
    )
    request = await agent.request()
    check_named(AGENT_DOC_LOADED, request, "ChannelLogsRequest")
    assert request == {
        "type": "logs",
        "streamId": request["streamId"],
        "rentalId": rental_id,
        "stackId": stack_id,
        "containerId": CONTAINER_ID,
        "tail": 10,
        "since": 1704067200,
        "timestamps": True,
        "follow": False,
    }
    stream = await agent.open_stream(request["streamId"])
    chunks = [frame(1, b"hello\n") + frame(2, b"oops\n"), frame(1, bytes(range(256)) * 300)]
    for chunk in chunks:
        await stream.send_bytes(chunk)
    await stream.send_json({"type": "end", "reason": "done"})
    await stream.close()
    async with await renter as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/vnd.docker.multiplexed-stream"
        assert await response.read() == b"".join(chunks)
    await until(lambda: not world.state.streams.live)


async def test_follow_streams_as_frames_come_and_says_why_it_ended(world):
    rental_id, stack_id = await world.stack_with_container()
    agent = await world.agent()
    renter = asyncio.create_task(
        world.http.get(world.logs_url(rental_id, stack_id), headers=world.renter, params={"follow": "1", "tail": "all"})
    )
    request = await agent.request()
    assert request["follow"] is True and "tail" not in request and "since" not in request
    stream = await agent.open_stream(request["streamId"])
    async with await renter as response:
        for line in (b"one\n", b"two\n"):  # each frame reaches the renter before the next is sent
            await stream.send_bytes(frame(1, line))
            assert await asyncio.wait_for(response.content.readexactly(8 + len(line)), 5) == frame(1, line)
        await stream.send_json({"type": "end", "reason": "error", "error": "engine went away"})
        assert await response.read() == frame(3, b"gpuhost: engine went away")
        await stream.close()


async def test_a_container_of_another_stack_or_rental_is_404(world):
    rental_a, stack_a = await world.stack_with_container("a-web-1", "a" * 64)
    rental_b, stack_b = await world.stack_with_container("b-web-1", "b" * 64)
    agent = await world.agent()
    for url in (
        world.logs_url(rental_a, stack_a, "b" * 64),
        world.logs_url(rental_a, stack_a, "b-web-1"),
        world.logs_url(rental_a, stack_b, "b" * 64),
        world.logs_url(rental_a, stack_a, "nope"),
    ):
        async with world.http.get(url, headers=world.renter) as response:
            assert response.status == 404, url
    status, _ = await world.call("POST", f"/rentals/{rental_b}/stacks/{stack_a}/containers/{'a' * 64}/terminal")
    assert status == 404
    await agent.nothing_asked()


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"tail": "-1"}, "tail"),
        ({"tail": "ten"}, "tail"),
        ({"since": "yesterday"}, "since"),
        ({"since": "1.5"}, "since"),
        ({"follow": "maybe"}, "follow"),
        ({"timestamps": "2"}, "timestamps"),
    ],
)
async def test_bad_query_is_400(world, params, fragment):
    rental_id, stack_id = await world.stack_with_container()
    async with world.http.get(world.logs_url(rental_id, stack_id), headers=world.renter, params=params) as response:
        assert response.status == 400
        assert fragment in (await response.json())["message"]


async def test_no_channel_is_503(world):
    rental_id, stack_id = await world.stack_with_container()
    async with world.http.get(world.logs_url(rental_id, stack_id), headers=world.renter) as response:
        assert response.status == 503


async def test_an_agent_that_does_not_answer_is_504_and_the_request_is_cancelled(world):
    rental_id, stack_id = await world.stack_with_container()
    agent = await world.agent()
    world.state.streams.answer_timeout = 0.3
    renter = asyncio.create_task(world.http.get(world.logs_url(rental_id, stack_id), headers=world.renter))
    request = await agent.request()
    cancel = await agent.request()
    check_named(AGENT_DOC_LOADED, cancel, "ChannelCancel")
    assert cancel == {"type": "cancel", "streamId": request["streamId"]}
    async with await renter as response:
        assert response.status == 504
    assert await handshake_status(agent.open_stream(request["streamId"])) == 404


@pytest.mark.parametrize("refusal, status", [(404, 404), (409, 409), (503, 503), (200, 502), ("x", 502)])
async def test_a_refusal_answers_with_its_status(world, refusal, status):
    rental_id, stack_id = await world.stack_with_container()
    agent = await world.agent()
    renter = asyncio.create_task(world.http.get(world.logs_url(rental_id, stack_id), headers=world.renter))
    request = await agent.request()
    refused = {"type": "refused", "streamId": request["streamId"], "status": refusal, "error": "no such container"}
    if refusal == 404:
        check_named(AGENT_DOC_LOADED, refused, "ChannelRefused")
    await agent.channel.send_json(refused)
    async with await renter as response:
        assert response.status == status
        assert "no such container" in (await response.json())["message"]
    assert await handshake_status(agent.open_stream(request["streamId"])) == 404


async def test_renter_leaving_closes_the_agent_stream(world):
    rental_id, stack_id = await world.stack_with_container()
    agent = await world.agent()
    renter = asyncio.create_task(
        world.http.get(world.logs_url(rental_id, stack_id), headers=world.renter, params={"follow": "true"})
    )
    stream = await agent.open_stream((await agent.request())["streamId"])
    response = await renter
    await stream.send_bytes(frame(1, b"x\n"))
    assert await response.content.readexactly(10) == frame(1, b"x\n")
    response.close()  # the renter goes away while the container is quiet
    message = await stream.receive(5)
    assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    await until(lambda: not world.state.streams.live)


async def stalled_flood(
    world: World, agent: ScriptedAgent, rental_id: str, stack_id: str, heartbeat: float | None = None
):
    """A follow stream whose renter reads nothing while the agent sends as fast as
    it can, once the agent's sends have made no progress for a second:
    (renter response, agent stream, bytes sent, stop event, sender task)."""
    renter = asyncio.create_task(
        world.http.get(world.logs_url(rental_id, stack_id), headers=world.renter, params={"follow": "true"})
    )
    stream = await agent.open_stream((await agent.request())["streamId"], heartbeat=heartbeat)
    response = await renter
    chunk = frame(1, b"y" * (256 * 1024 - 8))
    sent, stop = [0], asyncio.Event()

    async def flood() -> None:
        while not stop.is_set():
            await stream.send_bytes(chunk)
            sent[0] += len(chunk)
        await stream.send_json({"type": "end", "reason": "done"})

    sender = asyncio.create_task(flood())
    last, still_since = -1, time.monotonic()
    deadline = time.monotonic() + 20
    while time.monotonic() - still_since < 1.0:
        assert time.monotonic() < deadline and not sender.done(), "the agent's sends never blocked"
        if sent[0] != last:
            last, still_since = sent[0], time.monotonic()
        await asyncio.sleep(0.05)
    return response, stream, sent, stop, sender


async def test_a_renter_that_does_not_read_stalls_the_agent(world):
    """Backpressure: the marketplace does not buffer what the renter does not
    take (it holds one message at most); the agent's sends block instead (TCP
    flow control), and what was sent all arrives once the renter reads.

    The agent's stream has a heartbeat, as the real agent's has: its pings wait
    behind the data the marketplace leaves unread, so only the marketplace's
    own pings keep the stream open through the stall."""
    rental_id, stack_id = await world.stack_with_container()
    response, _stream, sent, stop, sender = await stalled_flood(
        world, await world.agent(), rental_id, stack_id, heartbeat=0.6
    )
    assert sent[0] < 96 * 1024 * 1024, f"{sent[0]} bytes went out before the sends blocked (socket buffers only)"
    stop.set()
    received = len(await asyncio.wait_for(response.read(), 30))
    await asyncio.wait_for(sender, 10)
    assert received == sent[0]
    response.release()


async def test_a_renter_that_does_not_read_does_not_hold_the_agent_stream_past_a_rental_end(world):
    rental_id, stack_id = await world.stack_with_container()
    response, stream, _sent, _stop, sender = await stalled_flood(world, await world.agent(), rental_id, stack_id)
    assert (await world.call("DELETE", f"/rentals/{rental_id}"))[0] == 200
    for _ in range(1000):  # the marketplace's pings may come first
        message = await stream.receive(10)
        if message.type is not aiohttp.WSMsgType.PING:
            break
    assert message.type is aiohttp.WSMsgType.CLOSE, message
    sender.cancel()
    await asyncio.gather(sender, return_exceptions=True)
    response.close()


# ---- terminals ---------------------------------------------------------------------


async def create_terminal(world: World, rental_id: str, stack_id: str, body=None, ref: str = "web-1") -> dict:
    status, created = await world.call(
        "POST", f"/rentals/{rental_id}/stacks/{stack_id}/containers/{ref}/terminal", body
    )
    assert status == 201, created
    return created


async def test_terminal_relays_both_ways(world):
    rental_id, stack_id = await world.stack_with_container()
    agent = await world.agent()
    created = await create_terminal(
        world, rental_id, stack_id, {"command": ["/bin/bash", "-l"], "cols": 100, "rows": 30}
    )
    assert set(created) == {"terminalId", "url", "expiresAt"}
    host = world.base.removeprefix("http://").removesuffix("/v1")
    assert created["url"].startswith(f"ws://{host}/v1/terminals/{created['terminalId']}?token=")
    assert 50 < (wire_time.parse_iso(created["expiresAt"]).timestamp() - time.time()) <= 60
    await agent.nothing_asked()  # an unopened URL costs the host nothing
    renter = asyncio.create_task(world.http.ws_connect(created["url"]))  # no API key
    request = await agent.request()
    check_named(AGENT_DOC_LOADED, request, "ChannelTerminalRequest")
    assert request == {
        "type": "terminal",
        "streamId": request["streamId"],
        "rentalId": rental_id,
        "stackId": stack_id,
        "containerId": CONTAINER_ID,
        "command": ["/bin/bash", "-l"],
        "cols": 100,
        "rows": 30,
    }
    stream = await agent.open_stream(request["streamId"])
    terminal = await renter
    await terminal.send_bytes(b"ls\n")
    assert (await stream.receive(5)).data == b"ls\n"
    await terminal.send_str(json.dumps({"type": "resize", "cols": 0, "rows": 5}))  # not passed on
    await terminal.send_str("not json")
    await terminal.send_str(json.dumps({"type": "resize", "cols": 120, "rows": 40, "extra": 1}))
    resize = json.loads((await stream.receive(5)).data)
    check_named(AGENT_DOC_LOADED, resize, "TerminalResize")
    assert resize == {"type": "resize", "cols": 120, "rows": 40}
    await stream.send_bytes(b"\x1b[1mfile\x1b[0m\r\n")
    assert (await terminal.receive(5)).data == b"\x1b[1mfile\x1b[0m\r\n"
    end = {"type": "end", "reason": "exited", "exitCode": 3}
    check_named(AGENT_DOC_LOADED, end, "StreamEnd")
    await stream.send_json(end)
    assert json.loads((await terminal.receive(5)).data) == end
    assert (await terminal.receive(5)).type is aiohttp.WSMsgType.CLOSE
    assert (await stream.receive(5)).type is aiohttp.WSMsgType.CLOSE


async def test_terminal_defaults_and_bad_bodies(world):
    rental_id, stack_id = await world.stack_with_container()
    agent = await world.agent()
    created = await create_terminal(world, rental_id, stack_id, ref=CONTAINER_ID)
    renter = asyncio.create_task(world.http.ws_connect(created["url"]))
    request = await agent.request()
    assert (request["command"], request["cols"], request["rows"]) == (["/bin/sh"], 80, 24)
    await agent.channel.send_json(
        {"type": "refused", "streamId": request["streamId"], "status": 409, "error": "container is not running"}
    )
    terminal = await renter
    end = json.loads((await terminal.receive(5)).data)
    assert end["type"] == "end" and end["reason"] == "error" and end["status"] == 409
    assert "container is not running" in end["error"]
    path = f"/rentals/{rental_id}/stacks/{stack_id}/containers/web-1/terminal"
    for body in (
        {"command": []},
        {"command": "sh"},
        {"command": ["sh", 1]},
        {"command": ["x"] * 65},
        {"cols": 0},
        {"rows": 1001},
        {"cols": True},
        [1],
    ):
        status, error = await world.call("POST", path, body)
        assert status == 400, body


async def test_terminal_token_is_checked_single_use_and_expires(world):
    rental_id, stack_id = await world.stack_with_container()
    agent = await world.agent()
    created = await create_terminal(world, rental_id, stack_id)
    url, token = created["url"], created["url"].split("token=")[1]
    assert token in logs.SECRETS, "the token is scrubbed from log lines while it lives"
    bare = url.split("?")[0]
    assert await handshake_status(world.http.ws_connect(bare + "?token=wrong")) == 401
    assert await handshake_status(world.http.ws_connect(bare)) == 401
    assert await handshake_status(world.http.ws_connect(bare.rsplit("/", 1)[0] + "/nope?token=" + token)) == 404
    renter = asyncio.create_task(world.http.ws_connect(url))
    request = await agent.request()
    stream = await agent.open_stream(request["streamId"])
    terminal = await renter
    assert token not in logs.SECRETS
    assert await handshake_status(world.http.ws_connect(url)) == 404, "single use"
    await terminal.close()
    assert (await stream.receive(5)).type is aiohttp.WSMsgType.CLOSE, "the renter's close closes the agent stream"

    world.state.terminals.ttl = 0.2
    expiring = await create_terminal(world, rental_id, stack_id)
    await asyncio.sleep(0.3)
    assert await handshake_status(world.http.ws_connect(expiring["url"])) == 404
    assert expiring["url"].split("token=")[1] not in logs.SECRETS


async def test_only_the_terminal_route_is_public(world):
    rental_id, stack_id = await world.stack_with_container()
    for path in ("/v1/terminals/x/../../rentals", "/v1/terminals/%2e%2e/rentals", "/v1/rentals"):
        async with world.http.get(world.base.removesuffix("/v1") + path) as response:
            assert response.status in (401, 404), path
            assert rental_id not in await response.text()
    async with world.http.post(world.base + "/terminals/x") as response:
        assert response.status in (401, 405)
    assert await handshake_status(world.http.ws_connect(world.base + "/agent/channel", headers=world.renter)) == 401
    assert await handshake_status(world.http.ws_connect(world.base + "/agent/streams/abc", headers=world.renter)) == 401
    assert (
        await handshake_status(world.http.ws_connect(world.base + "/agent/streams/abc", headers=world.agent_key)) == 404
    )


# ---- rentals, channels, sessions -------------------------------------------------------


async def open_both(world: World, agent: ScriptedAgent, rental_id: str, stack_id: str):
    """A follow log stream and a terminal, both relaying: (logs response, terminal, agent streams)."""
    renter_logs = asyncio.create_task(
        world.http.get(world.logs_url(rental_id, stack_id), headers=world.renter, params={"follow": "true"})
    )
    log_stream = await agent.open_stream((await agent.request())["streamId"])
    response = await renter_logs
    created = await create_terminal(world, rental_id, stack_id)
    renter_terminal = asyncio.create_task(world.http.ws_connect(created["url"]))
    terminal_stream = await agent.open_stream((await agent.request())["streamId"])
    return response, await renter_terminal, (log_stream, terminal_stream)


@pytest.mark.parametrize("how", ["renter ends it", "its end date passes"])
async def test_ending_a_rental_ends_its_streams(world, how):
    rental_id, stack_id = await world.stack_with_container()
    other_rental, other_stack = await world.stack_with_container("other-1", "f" * 64)
    agent = await world.agent()
    response, terminal, agent_streams = await open_both(world, agent, rental_id, stack_id)
    other = asyncio.create_task(
        world.http.get(
            world.logs_url(other_rental, other_stack, "f" * 64), headers=world.renter, params={"follow": "true"}
        )
    )
    other_stream = await agent.open_stream((await agent.request())["streamId"])
    other_response = await other
    if how == "renter ends it":
        assert (await world.call("DELETE", f"/rentals/{rental_id}"))[0] == 200
    else:
        world.state.store.rentals[rental_id]["endDate"] = "2000-01-01T00:00:00Z"
        assert world.state.expire_rentals() == [rental_id]
    assert await asyncio.wait_for(response.read(), 5) == frame(3, b"gpuhost: stream ended: rental-ended")
    response.release()
    assert json.loads((await terminal.receive(5)).data) == {"type": "end", "reason": "rental-ended"}
    for stream in agent_streams:
        assert (await stream.receive(5)).type is aiohttp.WSMsgType.CLOSE
    await other_stream.send_bytes(frame(1, b"still here\n"))  # the other rental's stream goes on
    assert await other_response.content.readexactly(19) == frame(1, b"still here\n")
    other_response.close()


async def test_a_newer_channel_replaces_the_older(world):
    rental_id, stack_id = await world.stack_with_container()
    first = await world.agent()
    second = await world.agent()
    assert (await first.channel.receive(5)).type is aiohttp.WSMsgType.CLOSE
    renter = asyncio.create_task(world.http.get(world.logs_url(rental_id, stack_id), headers=world.renter))
    request = await second.request()
    stream = await second.open_stream(request["streamId"])
    await stream.send_json({"type": "end", "reason": "done"})
    async with await renter as response:
        assert response.status == 200 and await response.read() == b""


async def test_a_superseded_session_cannot_open_the_channel(world):
    info = {"agentVersion": "t", "hostname": "h", "startedAt": wire_time.iso(), "capabilities": []}
    _, old = await world.call("POST", "/agent/sessions", info, world.agent_key)
    agent = await world.agent(old["sessionId"])
    _, new = await world.call("POST", "/agent/sessions", info, world.agent_key)
    assert (await agent.channel.receive(5)).type is aiohttp.WSMsgType.CLOSE, "a new session drops the old channel"
    assert not world.state.streams.connected
    stale = ScriptedAgent(world)
    assert await handshake_status(stale.connect(old["sessionId"])) == 409
    await stale.connect(new["sessionId"])


async def test_stopping_the_marketplace_ends_streams(world):
    rental_id, stack_id = await world.stack_with_container()
    agent = await world.agent()
    response, terminal, _ = await open_both(world, agent, rental_id, stack_id)
    await world.state.streams.shutdown()
    assert await asyncio.wait_for(response.read(), 5) == frame(3, b"gpuhost: stream ended: marketplace-stopping")
    response.release()
    assert json.loads((await terminal.receive(5)).data)["reason"] == "marketplace-stopping"
    assert (await agent.channel.receive(5)).type is aiohttp.WSMsgType.CLOSE


def test_documented_timings_are_the_code_s():
    channel = AGENT_DOC_LOADED["paths"]["/agent/channel"]["get"]["description"]
    assert f"pings every {channel_api.CHANNEL_HEARTBEAT:g} s" in channel
    assert f"within {channel_hub.ANSWER_TIMEOUT:g} s" in channel
    stream = AGENT_DOC_LOADED["paths"]["/agent/streams/{streamId}"]["get"]["description"]
    assert f"every {channel_hub.STREAM_KEEPALIVE:g} s" in " ".join(stream.split())
    terminal = load(LOCAL_DOC)["paths"]["/rentals/{rentalId}/stacks/{stackId}/containers/{containerId}/terminal"]
    assert f"valid for {terminal_tickets.TICKET_SECONDS:g} s" in terminal["post"]["description"]


async def test_a_terminal_on_a_container_that_is_not_running_is_refused_at_once(world):
    """It was refused only after the WebSocket had opened."""
    rental_id, stack_id = await world.stack_with_container()
    stopped = {**container("web-1", CONTAINER_ID), "State": "exited (1)"}
    status, _ = await world.call(
        "PUT",
        f"/agent/stacks/{stack_id}/containers",
        {"containers": [stopped], "observedAt": wire_time.iso()},
        world.agent_key,
    )
    assert status == 200
    status, body = await world.call("POST", f"/rentals/{rental_id}/stacks/{stack_id}/containers/web-1/terminal")
    assert status == 409 and "is exited (1)" in body["message"] and "running container" in body["message"]

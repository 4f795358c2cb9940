"""The agent's channel against a stand-in marketplace (a small aiohttp server on
127.0.0.1) and the real Docker Engine: requests in, refusals and streams out."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
from aiohttp import web
from support.engine import Containers
from support.renter_streams import STDERR, STDOUT, Demux
from support.wiring import stream_channel

from gpuhost_agent.protocol import wire
from gpuhost_agent.streams.limits import StreamLimits
from gpuhost_agent.uplink.client import MarketplaceClient

KEY = "env-key-secret"


class FakeMarket:
    """Plays the marketplace's two WebSocket routes, and records what the agent did."""

    def __init__(self):
        self.port = _free_port()
        self.channel: web.WebSocketResponse | None = None
        self.channel_opened = asyncio.Event()
        self.from_agent: asyncio.Queue = asyncio.Queue()
        self.headers: list[dict] = []
        self.streams: dict[str, asyncio.Queue] = {}
        self.stream_ws: dict[str, web.WebSocketResponse] = {}
        self.stream_opened = asyncio.Event()
        self.stalled: set[str] = set()  # streams whose reader stopped reading
        self.hold: dict[str, asyncio.Event] = {}  # streams whose handshake waits
        self.holding = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._open: set = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/agent/channel", self._channel)
        app.router.add_get("/v1/agent/streams/{streamId}", self._stream)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def stop(self) -> None:
        self.stalled.clear()
        for event in self.hold.values():
            event.set()
        for ws in list(self._open):
            await ws.close()
        await self._runner.cleanup()

    async def _channel(self, request: web.Request) -> web.WebSocketResponse:
        self.headers.append(dict(request.headers))
        if request.headers.get(wire.API_KEY_HEADER) != KEY:
            raise web.HTTPUnauthorized()
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.channel = ws
        self._open.add(ws)
        self.channel_opened.set()
        try:
            async for message in ws:
                self.from_agent.put_nowait(json.loads(message.data))
        finally:
            self._open.discard(ws)
        return ws

    async def _stream(self, request: web.Request) -> web.WebSocketResponse:
        stream_id = request.match_info["streamId"]
        assert request.headers.get(wire.API_KEY_HEADER) == KEY
        assert request.headers.get(wire.SESSION_HEADER) == "session-1"
        if stream_id in self.hold:
            self.holding.set()
            await self.hold[stream_id].wait()
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        queue = self.streams.setdefault(stream_id, asyncio.Queue())
        self.stream_ws[stream_id] = ws
        self._open.add(ws)
        self.stream_opened.set()
        try:
            while True:
                if stream_id in self.stalled:
                    await asyncio.sleep(0.05)
                    continue
                message = await ws.receive()
                if message.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                    queue.put_nowait(message.data)
                else:
                    break
        finally:
            queue.put_nowait(None)
            self._open.discard(ws)
        return ws

    async def ask(self, message: dict) -> None:
        await self.channel.send_str(json.dumps(message))

    async def collect(self, stream_id: str, timeout: float = 15) -> tuple[Demux, list[dict]]:
        """Everything of one stream until the agent closes it."""
        demux, texts = Demux(), []
        queue = await _wait_queue(self.streams, stream_id)
        while (item := await asyncio.wait_for(queue.get(), timeout)) is not None:
            if isinstance(item, bytes):
                demux.feed(item)
            else:
                texts.append(json.loads(item))
        return demux, texts

    async def output_until(self, stream_id: str, needle: str, timeout: float = 10) -> str:
        queue = await _wait_queue(self.streams, stream_id)
        seen = ""
        while needle not in seen:
            item = await asyncio.wait_for(queue.get(), timeout)
            assert item is not None, seen
            seen += item.decode(errors="replace") if isinstance(item, bytes) else f"<{item}>"
        return seen


async def _wait_queue(streams: dict, stream_id: str) -> asyncio.Queue:
    for _ in range(300):
        if stream_id in streams:
            return streams[stream_id]
        await asyncio.sleep(0.05)
    raise AssertionError(f"the agent never opened stream {stream_id}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
async def world(docker_client, tmp_path):
    market = FakeMarket()
    await market.start()
    made = Containers(docker_client)
    client = MarketplaceClient(market.base_url, KEY)
    client.session_id = "session-1"
    channel = await stream_channel(client, made.env_id, tmp_path, backoff_first=0.05, backoff_ceiling=0.5)
    task = asyncio.create_task(channel.run())
    try:
        await asyncio.wait_for(market.channel_opened.wait(), 10)
        yield market, channel, made
    finally:
        await channel.close()
        await asyncio.wait_for(task, 10)
        await client.close()
        await market.stop()
        await asyncio.to_thread(made.remove_all)


def target(made: Containers, container, stream_id: str, kind: str = "logs", **fields) -> dict:
    return {
        "type": kind,
        "streamId": stream_id,
        "rentalId": made.rental_id,
        "stackId": made.stack_id,
        "containerId": container.id,
        **fields,
    }


async def test_logs_on_a_stream_of_their_own(world):
    market, _channel, made = world
    assert market.headers[0][wire.API_KEY_HEADER] == KEY and market.headers[0][wire.SESSION_HEADER] == "session-1"
    box = await asyncio.to_thread(made.run, "echo out-1; echo err-1 >&2; echo out-2")
    await asyncio.to_thread(box.wait)
    await market.ask(target(made, box, "logs-1", tail=None, timestamps=False))
    demux, texts = await market.collect("logs-1")
    assert demux.lines(STDOUT) == ["out-1", "out-2"] and demux.lines(STDERR) == ["err-1"]
    assert texts == [{"type": "end", "reason": "done"}]


async def test_refusals(world, docker_client):
    market, _channel, made = world
    other_stack = await asyncio.to_thread(made.run, "sleep 3600", stack_id="another-stack")
    await market.ask(target(made, other_stack, "r-1"))
    await market.ask(target(made, other_stack, "r-2", tail=-1))
    await market.ask({**target(made, other_stack, "r-3"), "containerId": "no-such-container"})
    await market.ask({"type": "logs", "streamId": "bad/id"})  # no usable streamId: ignored
    await market.ask(target(made, other_stack, "r-4", kind="terminal", cols=5000))
    answers = {}
    for _ in range(4):
        answer = await asyncio.wait_for(market.from_agent.get(), 10)
        answers[answer["streamId"]] = answer
    assert answers["r-1"] == {
        "type": "refused",
        "streamId": "r-1",
        "status": 404,
        "error": "no such container in this stack",
    }
    assert answers["r-2"]["status"] == 400 and answers["r-4"]["status"] == 400
    assert answers["r-3"]["status"] == 404
    assert market.streams == {} and market.from_agent.empty()


async def test_terminal_and_slow_log_stream_side_by_side_then_rental_end(world):
    market, channel, made = world
    flood = await asyncio.to_thread(made.run, "while true; do echo a line of output that nobody is reading; done")
    box = await asyncio.to_thread(made.run, "sleep 3600")
    market.stalled.add("slow")  # this log stream's reader stops reading
    await market.ask(target(made, flood, "slow", follow=True))
    await asyncio.wait_for(market.stream_opened.wait(), 10)
    await asyncio.sleep(1.0)
    await market.ask(target(made, box, "term", kind="terminal", cols=90, rows=20))
    ws = await _wait_stream_ws(market, "term")
    await ws.send_bytes(b"stty size; echo hi-$((4*4))\n")
    seen = await market.output_until("term", "hi-16")
    assert "20 90" in seen
    await ws.send_str(json.dumps({"type": "resize", "cols": 101, "rows": 33}))
    await asyncio.sleep(0.2)
    await ws.send_bytes(b"stty size\n")
    await market.output_until("term", "33 101")
    assert channel.live() == {"logs": 1, "terminal": 1}

    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(channel.end_rental(made.rental_id), 15)
    assert channel.live() == {}
    assert asyncio.get_running_loop().time() - started < 8, "a stalled reader held the rental's end"
    rest = await market.output_until("term", "rental-ended")
    assert '"reason": "rental-ended"' in rest


async def _wait_stream_ws(market: FakeMarket, stream_id: str):
    await _wait_queue(market.streams, stream_id)
    return market.stream_ws[stream_id]


async def test_stream_limits_and_duplicate_ids(docker_client, tmp_path):
    """At most `streams` log streams and terminals open, at most
    `streams_per_rental` of them for one rental (another rental still gets
    one), and a streamId only once (streams/limits.py has the rest)."""
    market = FakeMarket()
    await market.start()
    made, other, third = Containers(docker_client), Containers(docker_client), Containers(docker_client)
    other.env_id = third.env_id = made.env_id
    client = MarketplaceClient(market.base_url, KEY)
    client.session_id = "session-1"
    channel = await stream_channel(client, made.env_id, tmp_path, limits=StreamLimits(streams=2, streams_per_rental=1))
    task = asyncio.create_task(channel.run())
    try:
        await asyncio.wait_for(market.channel_opened.wait(), 10)
        box = await asyncio.to_thread(made.run, "sleep 3600")
        other_box = await asyncio.to_thread(other.run, "sleep 3600")
        third_box = await asyncio.to_thread(third.run, "sleep 3600")
        await market.ask(target(made, box, "one", kind="terminal"))
        await _wait_stream_ws(market, "one")
        await market.ask(target(made, box, "one", kind="terminal"))
        await market.ask(target(made, box, "two"))
        first = await asyncio.wait_for(market.from_agent.get(), 10)
        second = await asyncio.wait_for(market.from_agent.get(), 10)
        assert (first["streamId"], first["status"]) == ("one", 409)
        assert (second["streamId"], second["status"]) == ("two", 429) and "this rental" in second["error"]
        await market.ask(target(other, other_box, "three", kind="terminal"))  # another renter is not starved
        await _wait_stream_ws(market, "three")
        await market.ask(target(third, third_box, "four"))
        fourth = await asyncio.wait_for(market.from_agent.get(), 10)
        assert (fourth["streamId"], fourth["status"]) == ("four", 503) and "too many" in fourth["error"]
    finally:
        await channel.close()
        await asyncio.wait_for(task, 10)
        await client.close()
        await market.stop()
        for containers in (made, other, third):
            await asyncio.to_thread(containers.remove_all)
    assert not task.exception()


async def test_reconnects_after_the_marketplace_restarts(world):
    market, channel, made = world
    box = await asyncio.to_thread(made.run, "echo still-served; sleep 3600")
    market.channel_opened.clear()
    await market.stop()
    await asyncio.sleep(0.5)
    assert not channel.connected.is_set()
    await market.start()
    await asyncio.wait_for(market.channel_opened.wait(), 10)
    await asyncio.wait_for(channel.connected.wait(), 5)
    await market.ask(target(made, box, "after"))
    demux, texts = await market.collect("after")
    assert demux.lines(STDOUT) == ["still-served"] and texts == [{"type": "end", "reason": "done"}]


async def test_close_ends_streams_with_agent_stopping(world):
    market, channel, made = world
    box = await asyncio.to_thread(made.run, "sleep 3600")
    await market.ask(target(made, box, "f", follow=True))
    await _wait_queue(market.streams, "f")
    await channel.close()
    _demux, texts = await market.collect("f")
    assert texts == [{"type": "end", "reason": "agent-stopping"}]


async def test_cancel_drops_a_pending_stream(world):
    market, channel, made = world
    box = await asyncio.to_thread(made.run, "echo never-sent; sleep 3600")
    market.hold["p"] = asyncio.Event()
    await market.ask(target(made, box, "p", follow=True))
    await asyncio.wait_for(market.holding.wait(), 10)  # the agent is connecting the stream
    assert channel.live() == {"logs": 1}
    await market.ask({"type": "cancel", "streamId": "p"})
    await market.ask({"type": "cancel", "streamId": "unknown"})
    for _ in range(100):
        if not channel.live():
            break
        await asyncio.sleep(0.05)
    assert channel.live() == {}
    market.hold["p"].set()
    await asyncio.sleep(0.3)
    assert "p" not in market.streams or market.streams["p"].qsize() <= 1

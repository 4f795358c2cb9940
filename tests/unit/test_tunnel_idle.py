"""The marketplace's tunnel relay closes a connection on which nothing moved
for its idle time, and keeps one that carries bytes open: a real TCP client
on loopback on one side, a real aiohttp WebSocket (the agent's stream) on the
other."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web

from gpuhost_agent.local_marketplace.tunnels import relay as tunnel_relay

IDLE = 0.4
Tunnel = tuple[asyncio.StreamReader, asyncio.StreamWriter, aiohttp.ClientWebSocketResponse]


@asynccontextmanager
async def _tunnel() -> AsyncIterator[Tunnel]:
    """A client's TCP connection and the agent's stream socket, with the relay between them."""
    accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    relays: list[asyncio.Task] = []

    async def stream(request: web.Request) -> web.WebSocketResponse:
        agent = web.WebSocketResponse()
        await agent.prepare(request)
        reader, writer = await accepted.get()
        relays.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await tunnel_relay.relay(reader, writer, agent, idle_seconds=IDLE)
        finally:
            writer.close()
        return agent

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put((reader, writer))

    app = web.Application()
    app.router.add_get("/stream", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    http_port = runner.addresses[0][1]
    listener = await asyncio.start_server(on_client, "127.0.0.1", 0)
    tcp_port = listener.sockets[0].getsockname()[1]
    try:
        client = await asyncio.open_connection("127.0.0.1", tcp_port)
        async with aiohttp.ClientSession() as session, session.ws_connect(f"http://127.0.0.1:{http_port}/stream") as ws:
            yield client[0], client[1], ws
        client[1].close()
    finally:
        listener.close()
        await runner.cleanup()


async def test_a_quiet_connection_is_closed_after_the_idle_time() -> None:
    async with _tunnel() as (reader, writer, agent):
        writer.write(b"ping")
        assert (await asyncio.wait_for(agent.receive(), 5)).data == b"ping"
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the relay closed the client's side
        waited = asyncio.get_running_loop().time() - started
        assert IDLE * 0.8 <= waited < IDLE + 2
        assert (await asyncio.wait_for(agent.receive(), 5)).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)


async def test_bytes_either_way_keep_it_open() -> None:
    async with _tunnel() as (reader, writer, agent):
        for turn in range(8):  # 8 × IDLE/2: twice the idle time in all
            if turn % 2:
                writer.write(b"up")
                assert (await asyncio.wait_for(agent.receive(), 5)).data == b"up"
            else:
                await agent.send_bytes(b"down")
                assert await asyncio.wait_for(reader.readexactly(4), 5) == b"down"
            await asyncio.sleep(IDLE / 2)
        writer.write(b"still")
        assert (await asyncio.wait_for(agent.receive(), 5)).data == b"still"

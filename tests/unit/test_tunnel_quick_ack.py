"""The relays acknowledge at once: the marketplace's a tunnel client's bytes
(TCP_QUICKACK at each read): OpenSSH writes two small messages in a row
during its key exchange and its login, and Nagle holds the second until the
first is acknowledged, which Linux's delayed ACK puts off by up to 40 ms
(bench/tunnel.py's `ssh host true`: 182 -> 107 ms); the agent's a service's
answer, for a service that writes it in two pieces. Checked on real sockets
through the real relays; the time saved is the bench's to show."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from support.fakes import MemorySink

from gpuhost_agent.local_marketplace.tunnels import relay as tunnel_relay
from gpuhost_agent.streams import tunnel
from gpuhost_agent.streams.tunnel import TunnelRelay

pytestmark = pytest.mark.skipif(tunnel_relay.QUICK_ACK is None, reason="TCP_QUICKACK is Linux's")


class Recording:
    """The client's socket as the relay sees it, recording its options."""

    def __init__(self, real: object) -> None:
        self.real, self.set = real, []

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self.set.append((level, option, value))
        self.real.setsockopt(level, option, value)  # type: ignore[attr-defined]


class Agent:
    """The stream's WebSocket: takes what the client sends."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.closed = asyncio.Event()

    async def send_bytes(self, data: bytes) -> None:
        self.got.append(data)

    async def send_str(self, _data: str) -> None:
        self.closed.set()

    async def receive(self):
        await asyncio.Event().wait()


async def test_each_read_of_the_clients_bytes_asks_for_an_immediate_ack() -> None:
    recorded: list[Recording] = []
    agent = Agent()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        real = writer.get_extra_info("socket")
        recording = Recording(real)
        recorded.append(recording)
        writer.get_extra_info = lambda name, default=None: recording if name == "socket" else default  # type: ignore[method-assign]
        await tunnel_relay.relay(reader, writer, agent, idle_seconds=5)  # type: ignore[arg-type]

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)  # Nagle on, as OpenSSH
        for message in (b"SSH-2.0-client\r\n", b"kexinit", b"ecdh-init"):
            writer.write(message)
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write_eof()
        await asyncio.wait_for(agent.closed.wait(), 5)
    finally:
        writer.close()
        server.close()
    assert b"".join(agent.got) == b"SSH-2.0-client\r\nkexinitecdh-init"
    quick = [entry for entry in recorded[0].set if entry == (socket.IPPROTO_TCP, tunnel_relay.QUICK_ACK, 1)]
    assert len(quick) >= 1 + len(agent.got), recorded[0].set  # at the start, then at each read


async def test_the_agent_acknowledges_a_services_answer_at_once() -> None:
    """The agent's side: a service that writes its head and its body apart
    with Nagle on (Python's http.server does) is acknowledged at each read."""

    async def nagle_service(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        await reader.readuntil(b"\r\n\r\n")
        for piece in (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", b"ok"):
            writer.write(piece)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(nagle_service, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    recording = Recording(writer.get_extra_info("socket"))
    writer.get_extra_info = lambda name, default=None: recording if name == "socket" else default  # type: ignore[method-assign]
    sink = MemorySink()
    relay = TunnelRelay(sink, reader, writer)
    try:
        running = asyncio.create_task(relay.run())
        sink.type(b"GET / HTTP/1.1\r\n\r\n")
        await sink.until(lambda: bytes(sink.binary).endswith(b"ok"))
        sink.type(json.dumps({"type": "eof"}))  # the client is done sending
        await asyncio.wait_for(running, 5)
    finally:
        server.close()
    quick = [entry for entry in recording.set if entry == (socket.IPPROTO_TCP, tunnel.QUICK_ACK, 1)]
    assert quick, recording.set

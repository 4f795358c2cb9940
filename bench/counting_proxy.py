"""A loopback TCP proxy that counts every byte between an agent and its
marketplace, both ways, and the HTTP requests in them (bench/idle_cost.py).

Counted on the wire rather than in the marketplace's handlers because the
wire is what a host pays for: request lines, headers, bodies, the replies,
and the channel WebSocket's frames (pings and pongs included) after its
upgrade. The agent's HTTP/1.1 requests are parsed only far enough to find
where each ends (Content-Length), so every byte is put down to the request
it belongs to; TCP and IP headers are not seen (the kernel adds them).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

_ID = re.compile(rb"/[0-9a-fA-F-]{16,}(?=/|$)")
_CHUNK = 64 * 1024


@dataclass
class Traffic:
    """Running totals; `snapshot()` copies them, so a window is the difference of two."""

    requests: Counter = field(default_factory=Counter)  # label -> requests
    sent: Counter = field(default_factory=Counter)  # label -> bytes agent to marketplace
    received: Counter = field(default_factory=Counter)  # label -> bytes marketplace to agent
    connections: int = 0

    def snapshot(self) -> Traffic:
        return Traffic(Counter(self.requests), Counter(self.sent), Counter(self.received), self.connections)

    def since(self, earlier: Traffic) -> Traffic:
        return Traffic(
            self.requests - earlier.requests,
            self.sent - earlier.sent,
            self.received - earlier.received,
            self.connections - earlier.connections,
        )


class _RequestStream:
    """One connection's agent-to-marketplace bytes, cut into requests. After a
    WebSocket upgrade (or a body it cannot delimit) everything that follows
    is put down to the last request."""

    def __init__(self, traffic: Traffic):
        self._traffic = traffic
        self._buffer = b""
        self._body_left = 0
        self._opaque = False
        self.label = "(before the first request)"

    def feed(self, data: bytes) -> None:
        while data:
            if self._opaque:
                self._traffic.sent[self.label] += len(data)
                return
            if self._body_left:
                taken = min(self._body_left, len(data))
                self._body_left -= taken
                self._traffic.sent[self.label] += taken
                data = data[taken:]
                continue
            self._buffer += data
            data = b""
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self._buffer[: end + 4], self._buffer[end + 4 :]
            self._buffer = b""
            self._start(head)

    def _start(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        method, _, rest = lines[0].partition(b" ")
        path = _ID.sub(b"/{id}", rest.partition(b" ")[0].partition(b"?")[0])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        self.label = f"{method.decode(errors='replace')} {path.decode(errors='replace')}"
        if headers.get(b"upgrade") == b"websocket":
            self.label += " (WebSocket)"
            self._opaque = True
        elif b"transfer-encoding" in headers:
            self._opaque = True  # chunked: not delimited here; the agent's client does not send it
        else:
            self._body_left = int(headers.get(b"content-length", b"0"))
        self._traffic.requests[self.label] += 1
        self._traffic.sent[self.label] += len(head)


class CountingProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to 127.0.0.1:`target_port`."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.traffic = Traffic()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _connection(self, agent_reader: asyncio.StreamReader, agent_writer: asyncio.StreamWriter) -> None:
        self.traffic.connections += 1
        try:
            market_reader, market_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            agent_writer.close()
            return
        requests = _RequestStream(self.traffic)

        def up(data: bytes) -> None:
            requests.feed(data)

        def down(data: bytes) -> None:
            self.traffic.received[requests.label] += len(data)

        pumps = [
            asyncio.create_task(_pump(agent_reader, market_writer, up)),
            asyncio.create_task(_pump(market_reader, agent_writer, down)),
        ]
        self._pumps.update(pumps)
        try:
            await asyncio.wait(pumps)  # each passes its side's end of stream on to the other
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._pumps.difference_update(pumps)
            for writer in (agent_writer, market_writer):
                writer.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: Callable[[bytes], None]) -> None:
    try:
        while data := await reader.read(_CHUNK):
            count(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:  # a reset on either side ends the connection, as it would without the proxy
        writer.close()

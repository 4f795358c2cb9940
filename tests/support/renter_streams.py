"""A renter's side of the log and terminal endpoints, for the end-to-end tests
and the log benchmark: what a renter's program would do with the HTTP API.

The demultiplexer here is written apart from the agent's own frame parser on
purpose: a test that read the agent's output with the agent's code would pass
with a bug both share.
"""

from __future__ import annotations

import struct

import aiohttp

from gpuhost_agent.protocol import wire

STDOUT, STDERR, SYSTEM = 1, 2, 3


class Demux:
    """Docker's multiplexed stream, fed in arbitrary pieces."""

    def __init__(self):
        self._pending = b""
        self.frames: list[tuple[int, bytes]] = []

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._pending += data
        out = []
        while len(self._pending) >= 8:
            stream, size = self._pending[0], struct.unpack(">I", self._pending[4:8])[0]
            if len(self._pending) < 8 + size:
                break
            out.append((stream, self._pending[8 : 8 + size]))
            self._pending = self._pending[8 + size :]
        self.frames += out
        return out

    @property
    def leftover(self) -> int:
        return len(self._pending)

    def text(self, stream: int) -> str:
        return b"".join(payload for kind, payload in self.frames if kind == stream).decode(errors="replace")

    def lines(self, stream: int) -> list[str]:
        return self.text(stream).splitlines()


def logs_path(rental_id: str, stack_id: str, container: str) -> str:
    return f"/rentals/{rental_id}/stacks/{stack_id}/containers/{container}/logs"


async def read_logs(http: aiohttp.ClientSession, base_url: str, key: str, path: str, **query) -> tuple[int, Demux, str]:
    """A whole (non-follow) log response: (status, frames, content type)."""
    params = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in query.items()}
    async with http.get(base_url + path, params=params, headers={wire.API_KEY_HEADER: key}) as response:
        demux = Demux()
        body = await response.read()
        if response.status == 200:
            demux.feed(body)
        return response.status, demux, response.headers.get("Content-Type", "")


async def create_terminal(
    http: aiohttp.ClientSession, base_url: str, key: str, rental_id: str, stack_id: str, container: str, **body
) -> tuple[int, dict]:
    path = f"/rentals/{rental_id}/stacks/{stack_id}/containers/{container}/terminal"
    async with http.post(base_url + path, json=body or None, headers={wire.API_KEY_HEADER: key}) as response:
        return response.status, await response.json(content_type=None)


async def terminal_until(ws: aiohttp.ClientWebSocketResponse, needle: str, timeout: float = 10) -> str:
    """The terminal's output up to and including `needle` (TTY output: \\r\\n line ends)."""
    import asyncio

    seen = ""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while needle not in seen:
        message = await ws.receive(timeout=max(0.01, deadline - loop.time()))
        if message.type == aiohttp.WSMsgType.BINARY:
            seen += message.data.decode(errors="replace")
        elif message.type == aiohttp.WSMsgType.TEXT:
            seen += f"\n<text {message.data}>\n"
        else:
            raise AssertionError(f"terminal closed before {needle!r}; saw {seen!r}")
    return seen

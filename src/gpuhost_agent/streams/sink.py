"""Where a stream goes: in production a WebSocket to the marketplace.

The log pump and the terminal see only this small interface, so the tests can
put a sink of controlled speed in the WebSocket's place. receive() serves two
purposes: a terminal's input, and noticing that the peer went away (a stream
nobody reads is ended, not followed forever).
"""

from __future__ import annotations

import asyncio
import json
from typing import Protocol

import aiohttp

from gpuhost_agent.errors import OutsideFailure

END_TIMEOUT = 3.0  # for the last message and the close, to a peer that may have stopped reading


class SinkClosed(OutsideFailure, ConnectionError):
    """The peer is gone; nothing more can be sent."""


class Sink(Protocol):
    async def send_bytes(self, data: bytes) -> None: ...

    async def send_json(self, message: dict) -> None: ...

    async def receive(self) -> bytes | str | None:
        """The next message from the peer; None once it closed."""

    async def close(self) -> None: ...


_ENDED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)


class WebSocketSink:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse[bool]):
        self._ws = ws

    async def send_bytes(self, data: bytes) -> None:
        try:
            await self._ws.send_bytes(data)
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            raise SinkClosed(str(exc)) from exc

    async def send_json(self, message: dict) -> None:
        try:
            await self._ws.send_str(json.dumps(message))
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            raise SinkClosed(str(exc)) from exc

    async def receive(self) -> bytes | str | None:
        while True:
            try:
                message = await self._ws.receive()
            except (ConnectionError, aiohttp.ClientError, RuntimeError):
                return None
            if message.type == aiohttp.WSMsgType.BINARY:
                return message.data
            if message.type == aiohttp.WSMsgType.TEXT:
                return message.data
            if message.type in _ENDED:
                return None

    async def close(self) -> None:
        try:
            await self._ws.close()
        except (ConnectionError, aiohttp.ClientError, RuntimeError):
            pass


async def finish(sink: Sink, end: dict | None, *, timeout: float = END_TIMEOUT) -> str:
    """Send the stream's last message (when there is one to send) and close.
    Bounded: a peer that stopped reading must not hold a rental's end. The
    reason sent, or "closed" when none could be."""
    if end is not None:
        try:
            await asyncio.wait_for(sink.send_json(end), timeout)
        except (SinkClosed, asyncio.TimeoutError):
            end = None
    try:
        await asyncio.wait_for(sink.close(), timeout)
    except asyncio.TimeoutError:
        pass
    return end["reason"] if end else "closed"

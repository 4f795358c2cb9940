"""The agent's WebSockets: `GET /v1/agent/channel` and `GET /v1/agent/streams/{streamId}`.

The auth middleware has already checked the environment's key (every
/v1/agent/ path needs it). The channel carries requests to the agent and its
refusals back; a stream socket is handed to the renter's request that asked for
it (logs_api.py, terminal_api.py), which reads and closes it. This handler only
keeps the socket's HTTP handler alive until that relay is done, because aiohttp
closes a WebSocket when its handler returns.
"""

from __future__ import annotations

import asyncio
import re

from aiohttp import WSCloseCode, WSMsgType, web

from gpuhost_agent.local_marketplace.agent_api import SESSION_SUPERSEDED, superseded
from gpuhost_agent.local_marketplace.channel_hub import close_quietly
from gpuhost_agent.local_marketplace.http_errors import json_error
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.protocol import wire

CHANNEL_HEARTBEAT = 15.0  # seconds between the marketplace's pings on the channel
CHANNEL_MAX_MESSAGE = 64 * 1024  # the agent sends only short JSON refusals
STREAM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def routes(state: MarketplaceState) -> list[web.RouteDef]:
    hub = state.streams

    async def channel(request: web.Request) -> web.StreamResponse:
        # A channel from a session that a newer one superseded belongs to an agent
        # process that should be gone; taking it would route requests away from
        # the current agent. Without a session header, or before any session
        # (a restarted marketplace), the channel is taken: the key was checked.
        session = request.headers.get(wire.SESSION_HEADER)
        if session and state.session_id and session != state.session_id:
            return json_error(409, superseded(session), code=SESSION_SUPERSEDED)
        ws = web.WebSocketResponse(heartbeat=CHANNEL_HEARTBEAT, max_msg_size=CHANNEL_MAX_MESSAGE)
        if not ws.can_prepare(request).ok:
            return json_error(400, "this path is a WebSocket: send an Upgrade request")
        await ws.prepare(request)
        await hub.attach_channel(ws, session or None)
        try:
            async for message in ws:
                if message.type is WSMsgType.TEXT:
                    hub.on_channel_text(message.data)
        finally:
            hub.detach_channel(ws)
        return ws

    async def stream(request: web.Request) -> web.StreamResponse:
        stream_id = request.match_info["streamId"]
        ws = web.WebSocketResponse(timeout=5.0)
        if not ws.can_prepare(request).ok:
            return json_error(400, "this path is a WebSocket: send an Upgrade request")
        waiting = hub.claim(stream_id) if STREAM_ID.fullmatch(stream_id) else None
        if waiting is None:
            return json_error(
                404, f"no stream {stream_id[:64]} is waiting (unknown, already opened, cancelled or timed out)"
            )
        await ws.prepare(request)
        if waiting.opened.done():  # the request gave up while the socket was being upgraded
            await close_quietly(ws, WSCloseCode.GOING_AWAY, b"stream no longer wanted")
            return ws
        waiting.agent_ws = ws
        waiting.opened.set_result(ws)
        await _keep_alive(ws, waiting.finished, hub.stream_keepalive)
        return ws

    return [
        web.get("/v1/agent/channel", channel),
        web.get("/v1/agent/streams/{streamId}", stream),
    ]


async def _keep_alive(ws: web.WebSocketResponse, finished: asyncio.Event, period: float) -> None:
    """Ping the agent's stream until the relay is done.

    The agent pings its streams (docs/streams.md) and gives up when no answer
    comes. On a log stream whose renter reads slowly the marketplace leaves the
    agent's data unread on purpose (backpressure), and the agent's pings wait
    behind it, unanswered. Any frame the agent receives counts as a sign of
    life to its WebSocket client, so a ping from this side, where nothing is
    congested, keeps a slow stream open; it is not timed (no pong is awaited)."""
    while not finished.is_set():
        try:
            await asyncio.wait_for(finished.wait(), period)
        except asyncio.TimeoutError:
            try:
                await ws.ping()
            except (ConnectionError, RuntimeError):
                await finished.wait()

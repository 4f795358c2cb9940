"""`GET /v1/rentals/{rentalId}/stacks/{stackId}/containers/{containerId}/logs` (docs/streams.md, section 4).

The body is the agent's frames, unchanged, in Docker's multiplexed-stream
format, so Docker's own demultiplexers read it. The relay reads the next agent
message only once the renter has taken the previous one (`await write`): a
slow renter slows the agent's socket down through TCP, and the marketplace
holds at most one message per stream, whatever the container prints.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
from collections.abc import Mapping

from aiohttp import WSMsgType, web

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.local_marketplace.channel_hub import CLOSE_TIMEOUT, Stream, StreamRefused
from gpuhost_agent.local_marketplace.http_errors import BadRequest, json_error
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.stream_targets import find_container, first_done, rental_active, renter_gone
from gpuhost_agent.protocol import wire_time

log = get_logger(__name__)

CONTENT_TYPE = "application/vnd.docker.multiplexed-stream"
AGENT_STREAM = 3  # frames the agent (or the marketplace) writes itself: "gpuhost: ..."
_DIGITS = re.compile(r"[0-9]{1,12}")
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


def frame(stream: int, payload: bytes) -> bytes:
    """One frame of Docker's multiplexed stream: stream byte, three zeros, big-endian length."""
    return struct.pack(">BxxxI", stream, len(payload)) + payload


def notice(text: str) -> bytes:
    return frame(AGENT_STREAM, f"gpuhost: {text}".encode())


def logs_request(query: Mapping[str, str]) -> dict:
    """The channel message's options from the query; BadRequest (400) names the bad one.
    tail: whole number or "all"; since: Unix seconds or an ISO 8601 date-time;
    timestamps, follow: true/false/1/0."""
    fields: dict = {}
    tail = query.get("tail", "all")
    if tail != "all":
        if not _DIGITS.fullmatch(tail):
            raise BadRequest("tail must be a whole number of lines (0 or more) or 'all'")
        fields["tail"] = int(tail)
    if "since" in query:
        since = query["since"]
        if _DIGITS.fullmatch(since):
            fields["since"] = int(since)
        elif wire_time.is_iso(since) and wire_time.parse_iso(since).timestamp() >= 0:
            fields["since"] = int(wire_time.parse_iso(since).timestamp())
        else:
            raise BadRequest("since must be Unix seconds (a whole number) or an ISO 8601 date-time")
    for name in ("timestamps", "follow"):
        value = query.get(name, "false").lower()
        if value not in _BOOLEANS:
            raise BadRequest(f"{name} must be true, false, 1 or 0")
        fields[name] = _BOOLEANS[value]
    return fields


def end_notice(message: dict | None) -> bytes:
    """The stream-3 frame that tells the renter why a stream ended early
    (nothing for `done` or `exited`: the logs are complete, and the agent's
    own line already said how a container it followed stopped)."""
    if message is None:
        return notice("the agent's stream closed before the logs ended")
    reason = message.get("reason")
    if reason in ("done", "exited"):
        return b""
    if reason == "error":
        return notice(str(message.get("error") or "the agent could not send the logs"))
    return notice(f"stream ended: {reason}")


def parse_end(text: str) -> dict | None:
    """The agent's `{"type": "end", ...}`, or None for any other text message (ignored)."""
    try:
        message = json.loads(text)
    except ValueError:
        return None
    if isinstance(message, dict) and message.get("type") == "end" and isinstance(message.get("reason"), str):
        return message
    return None


def routes(state: MarketplaceState) -> list[web.RouteDef]:
    store, hub = state.store, state.streams

    async def get_logs(request: web.Request) -> web.StreamResponse:
        rental_id, stack_id = request.match_info["rentalId"], request.match_info["stackId"]
        container = find_container(store, rental_id, stack_id, request.match_info["containerId"])
        fields = logs_request(request.query)
        try:
            stream = await hub.open("logs", rental_id, {"stackId": stack_id, "containerId": container, **fields})
        except StreamRefused as refused:
            return json_error(refused.status, refused.message)
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE, "Cache-Control": "no-store"})
        tail = None
        try:
            if not rental_active(store, rental_id):  # ended while the agent was opening the stream
                stream.end("rental-ended")
            await response.prepare(request)
            tail = await _relay(request, response, stream)
        finally:  # both at once: a renter that does not read must not keep the agent's stream open
            await asyncio.gather(hub.finish(stream), _finish(request, response, tail))
        return response

    return [web.get("/v1/rentals/{rentalId}/stacks/{stackId}/containers/{containerId}/logs", get_logs)]


async def _relay(request: web.Request, response: web.StreamResponse, stream: Stream) -> bytes | None:
    """Agent frames to the renter until the agent ends, the renter leaves, or the
    marketplace ends the stream. Returns the last frame to write (the reason the
    stream ended, b"" for none), or None when the renter is gone."""
    agent = stream.agent_ws
    if agent is None:
        raise RuntimeError("relay before the agent's stream socket opened")

    async def pump() -> bytes:
        while True:
            message = await agent.receive()
            if message.type is WSMsgType.BINARY:
                await response.write(message.data)  # the backpressure: no read before the renter took it
            elif message.type is WSMsgType.TEXT:
                end = parse_end(message.data)
                if end is not None:
                    return end_notice(end)
            else:  # CLOSE, CLOSING, CLOSED, ERROR: the agent went away without `end`
                return end_notice(None)

    async def ended() -> bytes:
        await stream.ended.wait()
        return notice(f"stream ended: {stream.end_reason}")

    first = await first_done(pump(), ended(), renter_gone(request))
    try:
        return first.result()
    except (ConnectionError, RuntimeError):  # the renter left: nothing to tell
        log.debug("logs_renter_gone", stream_id=stream.stream_id)
        return None


async def _finish(request: web.Request, response: web.StreamResponse, tail: bytes | None) -> None:
    """Write the last frame and end the body; a renter that does not take them
    within CLOSE_TIMEOUT is disconnected."""
    if tail is None or not response.prepared:
        return
    try:
        await asyncio.wait_for(response.write(tail) if tail else asyncio.sleep(0), CLOSE_TIMEOUT)
        await asyncio.wait_for(response.write_eof(), CLOSE_TIMEOUT)
    except (ConnectionError, RuntimeError):
        pass
    except asyncio.TimeoutError:
        if request.transport is not None:
            request.transport.close()

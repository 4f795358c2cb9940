"""The marketplace's end of the agent's channel and streams (docs/streams.md, sections 2 and 3).

The agent dials every connection (hosts sit behind NAT), so a renter's request
for logs or a terminal becomes a message on the agent's channel, and the answer
is a WebSocket the agent opens for that one stream. The hub is the meeting
point: it holds the current channel, the requests waiting for their stream
(keyed by the streamId the marketplace chose), and the live streams by rental,
so that ending a rental ends them too. It knows nothing of HTTP routes or of
what flows on a stream: logs_api.py and terminal_api.py relay, channel_api.py
accepts the agent's sockets.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass, field

from aiohttp import WSCloseCode, web

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.errors import Refusal

log = get_logger(__name__)

ANSWER_TIMEOUT = 10.0  # seconds the agent has to open a requested stream (or refuse it)
STREAM_KEEPALIVE = 5.0  # seconds between the marketplace's pings on a stream (channel_api._keep_alive)
CLOSE_TIMEOUT = 5.0  # seconds a closing WebSocket may wait for the other side's close frame
REFUSAL_STATUSES = range(400, 600)


class StreamRefused(Refusal):
    """A stream that will not be opened: the HTTP status to answer and why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(eq=False)
class Stream:
    """One requested (then open) stream. `ended` is set when the marketplace
    itself ends it (rental end, shutdown): the relay then stops and says why."""

    stream_id: str
    rental_id: str
    opened: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    end_reason: str | None = None
    agent_ws: web.WebSocketResponse | None = None

    def end(self, reason: str) -> None:
        if not self.ended.is_set():
            self.end_reason = reason
            self.ended.set()


async def close_quietly(ws: web.WebSocketResponse | None, code: int = WSCloseCode.OK, message: bytes = b"") -> None:
    """Close a WebSocket whatever state it is in, without hanging on a peer that does not answer."""
    if ws is None or ws.closed:
        return
    try:
        await asyncio.wait_for(ws.close(code=code, message=message), CLOSE_TIMEOUT)
    except (asyncio.TimeoutError, ConnectionError, RuntimeError):
        pass


class ChannelHub:
    def __init__(self, answer_timeout: float = ANSWER_TIMEOUT, stream_keepalive: float = STREAM_KEEPALIVE):
        self.answer_timeout = answer_timeout
        self.stream_keepalive = stream_keepalive
        self.channel: web.WebSocketResponse | None = None
        self.channel_session: str | None = None
        self.pending: dict[str, Stream] = {}
        self.live: dict[str, set[Stream]] = {}  # rentalId -> streams asked for and not finished
        self.stopping = False

    @property
    def connected(self) -> bool:
        return self.channel is not None and not self.channel.closed

    # ---- the channel -----------------------------------------------------------
    async def attach_channel(self, ws: web.WebSocketResponse, session_id: str | None) -> None:
        """The newest channel is the one requests go to; an older one is closed,
        so an agent that reconnected before its old socket timed out is not
        asked twice."""
        older, self.channel, self.channel_session = self.channel, ws, session_id
        log.info("agent_channel_open", replaced=older is not None)
        if older is not None:
            await close_quietly(older, WSCloseCode.GOING_AWAY, b"replaced by a newer channel")

    def detach_channel(self, ws: web.WebSocketResponse) -> None:
        if self.channel is ws:
            self.channel, self.channel_session = None, None
            log.info("agent_channel_closed")

    def session_changed(self, session_id: str) -> None:
        """A new agent session: a channel opened by an older session belongs to
        an agent that is gone or superseded; drop it so requests wait for the new one."""
        if self.channel is not None and self.channel_session and self.channel_session != session_id:
            old = self.channel
            self.detach_channel(old)
            asyncio.ensure_future(close_quietly(old, WSCloseCode.GOING_AWAY, b"session superseded"))

    def on_channel_text(self, text: str) -> None:
        """A message from the agent on the channel. Only `refused` exists; other
        types are ignored, as the protocol grows additively."""
        try:
            message = json.loads(text)
        except ValueError:
            log.warning("agent_channel_message_unreadable")
            return
        if not isinstance(message, dict) or message.get("type") != "refused":
            return
        stream_id = message.get("streamId")
        stream = self.pending.pop(stream_id, None) if isinstance(stream_id, str) else None
        if stream is None or stream.opened.done():
            return
        status = message.get("status")
        if not isinstance(status, int) or isinstance(status, bool) or status not in REFUSAL_STATUSES:
            status = 502
        given = message.get("error")
        error = given if isinstance(given, str) else "no reason given"
        stream.opened.set_exception(StreamRefused(status, f"the agent refused: {error[:1000]}"))

    async def _send(self, message: dict) -> bool:
        channel = self.channel
        if channel is None or channel.closed:
            return False
        try:
            await channel.send_json(message)
            return True
        except (ConnectionError, RuntimeError):
            return False

    # ---- streams ---------------------------------------------------------------
    async def open(self, kind: str, rental_id: str, fields: dict) -> Stream:
        """Ask the agent for a stream and wait until it opens it. Raises
        StreamRefused: 503 with no channel, 504 when the agent does not answer
        in time (the request is then cancelled), the agent's status when it refuses."""
        if self.stopping:
            raise StreamRefused(503, "the marketplace is stopping")
        if not self.connected:
            raise StreamRefused(503, "the agent is not connected to the marketplace")
        stream = Stream(stream_id=secrets.token_urlsafe(16), rental_id=rental_id)
        self.pending[stream.stream_id] = stream
        # Live from the start: a rental end or shutdown that comes while the agent
        # is opening the stream marks it ended, and the relay stops at once.
        self.live.setdefault(rental_id, set()).add(stream)
        opened = False
        try:
            if not await self._send({"type": kind, "streamId": stream.stream_id, "rentalId": rental_id, **fields}):
                raise StreamRefused(503, "the agent is not connected to the marketplace")
            try:
                await asyncio.wait_for(asyncio.shield(stream.opened), self.answer_timeout)
            except asyncio.TimeoutError:
                stream.opened.cancel()
                await self._send({"type": "cancel", "streamId": stream.stream_id})
                raise StreamRefused(504, f"the agent did not answer within {self.answer_timeout:g} s") from None
            opened = True
        finally:
            self.pending.pop(stream.stream_id, None)
            if not opened:
                self._forget(stream)
        return stream

    def claim(self, stream_id: str) -> Stream | None:
        """The waiting request the agent's new stream answers (once only)."""
        stream = self.pending.pop(stream_id, None)
        return None if stream is None or stream.opened.done() else stream

    async def finish(self, stream: Stream, code: int = WSCloseCode.OK, message: bytes = b"") -> None:
        """The renter's side is done: close the agent's socket and forget the stream."""
        self._forget(stream)
        try:
            await close_quietly(stream.agent_ws, code, message)
        finally:
            stream.finished.set()

    def _forget(self, stream: Stream) -> None:
        streams = self.live.get(stream.rental_id)
        if streams is not None:
            streams.discard(stream)
            if not streams:
                del self.live[stream.rental_id]

    def end_rental(self, rental_id: str) -> None:
        """The rental ended: requests still waiting fail, open streams end."""
        for stream in [s for s in self.pending.values() if s.rental_id == rental_id]:
            del self.pending[stream.stream_id]
            if not stream.opened.done():
                stream.opened.set_exception(StreamRefused(400, f"rental {rental_id} has ended"))
            asyncio.ensure_future(self._send({"type": "cancel", "streamId": stream.stream_id}))
        for stream in list(self.live.get(rental_id, ())):
            stream.end("rental-ended")

    def reopen(self) -> None:
        """A marketplace started again on the same state (tests restart one on
        its store) takes requests again."""
        self.stopping = False

    async def shutdown(self) -> None:
        """The marketplace stops: end every stream and close the channel."""
        self.stopping = True
        for streams in list(self.live.values()):
            for stream in list(streams):
                stream.end("marketplace-stopping")
        for stream in list(self.pending.values()):
            if not stream.opened.done():
                stream.opened.set_exception(StreamRefused(503, "the marketplace is stopping"))
        self.pending.clear()
        channel, self.channel = self.channel, None
        await close_quietly(channel, WSCloseCode.GOING_AWAY, b"marketplace stopping")

"""The agent's channel: where the marketplace asks for logs and terminals (docs/streams.md, 2).

The agent dials out (hosts sit behind NAT), keeps one WebSocket open, and for
each accepted request opens another WebSocket for that stream alone: TCP's
flow control then slows a slow reader without stalling the channel or the
other streams. Each stream is a task of its own; the channel task only
parses and dispatches, so nothing a stream does can block it.

Streams are kept by rental, so that a rental's end (or the agent's) ends its
terminals and logs at once. Neither the API key nor anything a stream carries
is ever logged.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.streams.admission import (
    admit,
    over_exec_rate,
    pre_login_to_drop,
    refusal_on_arrival,
    refusal_when_ended,
    send_refusal,
)
from gpuhost_agent.streams.limits import StreamLimits
from gpuhost_agent.streams.log_pump import LOG_STALL_SECONDS, LogPump
from gpuhost_agent.streams.requests import (
    CancelRequest,
    LogsRequest,
    Refusal,
    SshRequest,
    StreamRequest,
    TerminalRequest,
    kind_of,
    parse_request,
)
from gpuhost_agent.streams.sink import END_TIMEOUT, WebSocketSink
from gpuhost_agent.streams.ssh.access import SshServices
from gpuhost_agent.streams.terminal import Terminal
from gpuhost_agent.streams.tunnel import TunnelRelay
from gpuhost_agent.uplink.client import MarketplaceClient, retry_delay
from gpuhost_agent.uplink.session import SessionState

if TYPE_CHECKING:
    from gpuhost_agent.streams.ssh.connection import SshConnection

log = get_logger(__name__)

HEARTBEAT_SECONDS = 15.0
BACKOFF_FIRST, BACKOFF_CEILING = 0.2, 10.0
MAX_CHANNEL_MESSAGE = 256 * 1024
MAX_STREAM_INPUT = 1024 * 1024  # a terminal's input message
STOP_WAIT = 10.0


@dataclass(eq=False)
class _Stream:
    request: StreamRequest
    task: asyncio.Task | None = None
    runner: LogPump | Terminal | TunnelRelay | SshConnection | None = None  # None while pending
    ended: str | None = None  # why it was ended from outside


class StreamChannel:
    def __init__(
        self,
        client: MarketplaceClient,
        session: SessionState,
        engine: EngineStreams,
        ssh: SshServices,
        *,
        limits: StreamLimits = StreamLimits(),  # noqa: B008 - frozen, shared safely
        heartbeat: float = HEARTBEAT_SECONDS,
        log_stall_seconds: float = LOG_STALL_SECONDS,
        backoff_first: float = BACKOFF_FIRST,
        backoff_ceiling: float = BACKOFF_CEILING,
    ):
        self._client = client
        self._agent_session = session
        self._engine = engine  # the channel's alone: close() closes it
        self._ssh = ssh
        self._limits = limits
        self._heartbeat = heartbeat
        self._stall = log_stall_seconds
        self._backoff = (backoff_first, backoff_ceiling)
        self._streams: dict[str, _Stream] = {}
        self._ws: aiohttp.ClientWebSocketResponse[bool] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._closing = asyncio.Event()
        self._sending: set[asyncio.Task] = set()  # refusals on their way
        self.connected = asyncio.Event()

    # ---- what agent.py calls -------------------------------------------------------
    async def run(self) -> None:
        """Keep the channel open until close(): reopened with backoff whenever
        it closes; an outage is logged once, and its end once."""
        failures, down_since = 0, None
        while not self._closing.is_set():
            try:
                async with self._session().ws_connect(
                    self._url("/agent/channel"),
                    headers=self._client.auth_headers(),
                    heartbeat=self._heartbeat,
                    max_msg_size=MAX_CHANNEL_MESSAGE,
                ) as ws:
                    self._ws = ws
                    self.connected.set()
                    failures = 0
                    if down_since is not None:
                        log.info("stream_channel_back", down_seconds=round(_now() - down_since, 1))
                        down_since = None
                    async for message in ws:
                        if message.type == aiohttp.WSMsgType.TEXT:
                            self._dispatch(message.data)
                    problem = f"closed by the marketplace ({ws.close_code})"
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                problem = _describe(exc)
            finally:
                self._ws = None
                self.connected.clear()
            if self._closing.is_set():
                break
            if down_since is None:
                down_since = _now()
                log.warning(
                    "stream_channel_down",
                    error=problem,
                    hint="logs and terminals are unavailable until it reopens; retrying",
                )
            failures += 1
            try:
                await asyncio.wait_for(
                    self._closing.wait(), retry_delay(failures - 1, base=self._backoff[0], ceiling=self._backoff[1])
                )
            except asyncio.TimeoutError:
                pass

    async def end_rental(self, rental_id: str) -> None:
        """End the rental's terminals and log streams (rental-ended); returns once they ended."""
        await self._end([s for s in self._streams.values() if s.request.rental_id == rental_id], "rental-ended")

    async def close(self) -> None:
        """End every stream (agent-stopping) and the channel; run() returns."""
        self._closing.set()
        await self._end(list(self._streams.values()), "agent-stopping")
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        await self._engine.close()

    def live(self) -> dict[str, int]:
        """Open streams by kind, for status reports."""
        counts: dict[str, int] = {}
        for stream in self._streams.values():
            kind = kind_of(stream.request)
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def open_requests(self) -> list[StreamRequest]:
        """What each stream open or being opened was asked for (the status
        socket counts a tunnel's connections in them); read-only."""
        return [stream.request for stream in self._streams.values()]

    def session_info(self) -> dict:
        """What the agent's session tells the marketplace of its streams: the
        SSH host key, which renters pin and tunnel info shows."""
        host_key = self._ssh.host_key
        return {"sshHostKey": host_key.public_line, "sshHostKeyFingerprint": host_key.fingerprint}

    def stats(self) -> dict:
        return {"channelConnected": self.connected.is_set(), "open": self.live()}

    # ---- requests ------------------------------------------------------------------
    def _dispatch(self, text: str) -> None:
        try:
            request = parse_request(json.loads(text))
        except (ValueError, RecursionError):
            log.warning("stream_request_unreadable", hint="a channel message that is not JSON; ignored")
            return
        if isinstance(request, Refusal):
            if request.stream_id is None:
                log.warning("stream_request_ignored", error=request.error)
            else:
                self._refuse(request)
            return
        if isinstance(request, CancelRequest):
            stream = self._streams.get(request.stream_id)
            if stream is not None and stream.runner is None and stream.task is not None:
                stream.task.cancel()
            return
        open_requests = [s.request for s in self._streams.values()]
        crowded = pre_login_to_drop(request, open_requests, self._limits)
        if crowded is not None:  # a stranger's idle SSH connection makes room for a newer one
            crowded.login.dropped = True
            self._end_now(self._streams[crowded.stream_id], "ssh-login-crowded")
        stopping = self._closing.is_set()
        refusal = refusal_on_arrival(request, request.stream_id in self._streams, open_requests, self._limits, stopping)
        if refusal is not None:
            return self._refuse(refusal)
        stream = _Stream(request)
        self._streams[request.stream_id] = stream
        stream.task = asyncio.create_task(self._serve(stream), name=f"stream-{request.stream_id}")

    def _refuse(self, refusal: Refusal) -> None:
        log.info("stream_refused", stream_id=refusal.stream_id, status=refusal.status, error=refusal.error)
        ws = self._ws
        if ws is not None and not ws.closed:
            task = asyncio.create_task(send_refusal(ws, refusal))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _serve(self, stream: _Stream) -> None:
        request = stream.request
        kind = kind_of(request)
        try:
            refusal, info, service = await admit(self._engine, self._agent_session, request, self._ssh.stack_containers)
            refusal = refusal or over_exec_rate(request, self._ssh.execs)
            if refusal is not None:
                return self._refuse(refusal)
            ws = await self._session().ws_connect(
                self._url(f"/agent/streams/{request.stream_id}"),
                headers=self._client.auth_headers(),
                heartbeat=self._heartbeat,
                max_msg_size=MAX_STREAM_INPUT,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=END_TIMEOUT),
            )
            sink = WebSocketSink(ws)
            if isinstance(request, LogsRequest):
                stream.runner = LogPump(self._engine, request, sink, info=info, stall_seconds=self._stall)
            elif isinstance(request, TerminalRequest):
                stream.runner = Terminal(self._engine, request, sink, container_id=info.get("Id"))
            elif isinstance(request, SshRequest):
                connection = await asyncio.to_thread(_load_ssh, self._ssh)
                stream.runner = connection(self._ssh, request, sink, self._agent_session.env_id)
            else:
                assert service is not None  # connected above, for a tunnel
                stream.runner = TunnelRelay(sink, *service)
            if stream.ended:
                stream.runner.stop(stream.ended)
            log.info("stream_opened", stream_id=request.stream_id, kind=kind, rental_id=request.rental_id)
            reason = await stream.runner.run()
            log.info("stream_ended", stream_id=request.stream_id, kind=kind, reason=reason)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            log.warning("stream_connect_failed", stream_id=request.stream_id, kind=kind, error=_describe(exc))
        except asyncio.CancelledError:
            if stream.runner is None:  # cancelled while pending: no stream will be opened
                return
            raise
        except Exception as exc:  # one stream's bug must not end the others
            log.error("stream_failed", stream_id=request.stream_id, kind=kind, error=f"{type(exc).__name__}: {exc}")
        finally:
            self._streams.pop(request.stream_id, None)

    async def _end(self, streams: list[_Stream], reason: str) -> None:
        for stream in streams:
            self._end_now(stream, reason)
        tasks = [s.task for s in streams if s.task is not None]
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=STOP_WAIT)
            for task in pending:
                task.cancel()

    def _end_now(self, stream: _Stream, reason: str) -> None:
        stream.ended = stream.ended or reason
        if stream.runner is not None:
            stream.runner.stop(reason)
        elif stream.task is not None:
            stream.task.cancel()
            self._refuse(refusal_when_ended(stream.request.stream_id, reason))

    # ---- connections ---------------------------------------------------------------
    def _session(self) -> aiohttp.ClientSession:
        """A session of its own: no connection limit (one connection per
        stream), and no overall timeout (a stream may last for days)."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=20),
            )
        return self._http

    def _url(self, path: str) -> str:
        return f"{self._client.base_url}{path}"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.WSServerHandshakeError):
        return f"HTTP {exc.status} on the WebSocket handshake"
    return f"{type(exc).__name__}: {exc}"[:300]


def _now() -> float:
    return asyncio.get_running_loop().time()


def _load_ssh(services: SshServices) -> type[SshConnection]:
    """asyncssh and the host key, on the first SSH stream, in a worker thread
    (imports and the key file are disk reads): the agent loads them only once
    a renter uses SSH (streams/ssh/host_key.py says why)."""
    from gpuhost_agent.streams.ssh.connection import SshConnection

    services.host_key.key  # noqa: B018 - loads the key and keeps it
    return SshConnection

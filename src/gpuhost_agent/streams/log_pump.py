"""One log stream: engine -> frames -> bounded buffer -> sink (docs/streams.md, "Logs").

Three tasks: the producer reads the engine and parses, the sender coalesces
whole frames into messages of about 64 KiB (one message per line would cost
more than the lines), and a watcher notices the peer leaving. They meet in a
buffer of LOG_BUFFER_BYTES. Backpressure comes first: while the buffer is full
the producer waits, so a slow reader slows the engine read and nothing is
lost. Only a buffer full for LOG_STALL_SECONDS makes the producer drop whole
frames, counted, and say so (stream 3) before the next frame that goes out:
memory stays bounded, and a reader that stopped cannot pin the engine's follow.

A follow that has been silent for a while is checked against the log itself
(follow_check.py) and opened again when it stalled behind it.
"""

from __future__ import annotations

import asyncio
import collections

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.streams import ContainerGone, EngineStreams, EngineUnreachable, LogReader
from gpuhost_agent.streams import frames
from gpuhost_agent.streams.follow_check import FOLLOW_CHECK_SECONDS, FollowCheck
from gpuhost_agent.streams.requests import LogsRequest
from gpuhost_agent.streams.sink import Sink, finish

log = get_logger(__name__)

LOG_BUFFER_BYTES = 1024 * 1024
LOG_STALL_SECONDS = 5.0
MESSAGE_BYTES = 64 * 1024
POLL_SECONDS = 0.5


class LogPump:
    def __init__(
        self,
        engine: EngineStreams,
        request: LogsRequest,
        sink: Sink,
        *,
        info: dict | None = None,
        buffer_bytes: int = LOG_BUFFER_BYTES,
        stall_seconds: float = LOG_STALL_SECONDS,
        poll_seconds: float = POLL_SECONDS,
        message_bytes: int = MESSAGE_BYTES,
        follow_check_seconds: float = FOLLOW_CHECK_SECONDS,
    ):
        self._engine = engine
        self._request = request
        self._sink = sink
        self._info = info  # the access check's inspect, when the caller has one
        self._limit = buffer_bytes
        self._stall = stall_seconds
        self._poll = poll_seconds
        self._message_bytes = message_bytes
        self.follow_check = FollowCheck(engine, follow_check_seconds)
        self._buffer: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._space = asyncio.Event()
        self._data = asyncio.Event()
        self._produced = False
        self._dropping = False
        self.dropped_lines = self.dropped_bytes = 0  # not yet reported
        self._stop_reason: str | None = None
        self._stopped = asyncio.Event()
        self._was_running = False
        self.exit_code: object = None  # set when a follow ended because the container stopped

    def stop(self, reason: str) -> None:
        """End the stream from outside (rental-ended, agent-stopping)."""
        if self._stop_reason is None:
            self._stop_reason = reason
            self._stopped.set()

    async def run(self) -> str:
        """Until the stream ends; the reason it ended ("closed": the peer left)."""
        producer = asyncio.create_task(self._produce())
        sender = asyncio.create_task(self._send_all())
        watcher = asyncio.create_task(self._watch_peer())
        stopped = asyncio.create_task(self._stopped.wait())
        end: dict | None = None
        try:
            await asyncio.wait({producer, sender, watcher, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if producer.done() and not stopped.done():
                reason, error = _outcome(producer)
                self._produced = True
                self._data.set()
                await asyncio.wait({sender, watcher, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if sender.done() and not sender.exception() and not stopped.done():
                    end = {"type": "end", "reason": reason, **({"error": error} if error else {})}
                    if reason == "exited" and isinstance(self.exit_code, int):
                        end["exitCode"] = self.exit_code
            if stopped.done():
                end = {"type": "end", "reason": self._stop_reason}
        finally:
            for task in (producer, sender, watcher, stopped):
                task.cancel()
            await asyncio.gather(producer, sender, watcher, stopped, return_exceptions=True)
        return await finish(self._sink, end)

    # ---- producer --------------------------------------------------------------
    async def _produce(self) -> tuple[str, str | None]:
        request = self._request
        info = self._info or await self._engine.inspect(request.container_id)
        container = info.get("Id") or request.container_id
        tty = bool((info.get("Config") or {}).get("Tty"))
        started = (info.get("State") or {}).get("StartedAt")
        self._was_running = bool((info.get("State") or {}).get("Running"))
        parser = frames.parser_for(tty, request.timestamps)
        tail, since = request.tail, None if request.since is None else str(request.since)
        while True:
            try:
                reader = await self._engine.open_logs(container, follow=request.follow, tail=tail, since=since)
                try:
                    while chunk := await self._read(reader, container, parser):
                        batch = parser.feed(chunk)
                        if batch is not None:
                            await self._put(batch)
                finally:
                    reader.close()
                batch = parser.flush()
                if batch is not None:
                    await self._put(batch)
            except ContainerGone:
                return self._done("container-removed")
            except EngineUnreachable:
                if not request.follow:
                    raise
            if not request.follow:
                return self._done("done")
            outcome, started, finished = await self._until_running(container, started)
            if outcome:
                return outcome
            tail = None
            since = parser.resume(after=finished) or since

    async def _read(self, reader: LogReader, container: str, parser: frames.FrameParser | frames.RawParser) -> bytes:
        if not self._request.follow:
            return await reader.read()
        return await self.follow_check.read(reader, container, parser)

    async def _until_running(
        self, container: str, started: str | None
    ) -> tuple[tuple[str, str | None] | None, str | None, bytes | None]:
        """After a follow ended: (None, StartedAt, FinishedAt) once the
        container runs again. The follow ends, as `docker logs -f` does, when
        the container is removed or has stopped with no restart coming
        (neither running nor restarting): then the outcome comes first. A
        follow that broke while the container ran resumes after one poll."""
        said = confirmed = False
        finished = None
        while True:
            try:
                state = (await self._engine.inspect(container)).get("State") or {}
            except ContainerGone:
                return self._done("container-removed"), started, None
            except EngineError:  # the engine is away: wait for it
                state = None
            if state is not None:
                if not state.get("Running") and not state.get("Restarting"):
                    if self._ran_here(state, started) and not confirmed:
                        confirmed = True  # `docker rm -f` kills first: look once more for a removal
                        await asyncio.sleep(self._poll)
                        continue
                    return self._stopped_for_good(state, said, started), started, None
                running = state.get("Running") and not state.get("Restarting")
                finished = _stamp(state.get("FinishedAt")) or finished
                if not said and (not running or state.get("StartedAt") != started):
                    self._put_now(frames.exited_frame(state.get("ExitCode")))
                    said = True
                if running and said:
                    return None, state.get("StartedAt"), finished
            await asyncio.sleep(self._poll)
            if state is not None and running and not said:
                return None, started, finished

    def _stopped_for_good(self, state: dict, said: bool, started: str | None) -> tuple[str, str | None]:
        """The follow's end on a stopped container. One that ran during this
        stream gets a last line saying how it ended (unless a restart notice
        already said it); one stopped before the stream began ends as plainly
        as `docker logs -f` does."""
        if self._ran_here(state, started) and not said:
            self._put_now(frames.stopped_frame(state.get("ExitCode")))
        self.exit_code = state.get("ExitCode")
        return self._done("exited")

    def _ran_here(self, state: dict, started: str | None) -> bool:
        return self._was_running or state.get("StartedAt") != started

    def _done(self, reason: str) -> tuple[str, str | None]:
        if self.dropped_lines:
            self._put_now(frames.dropped_frame(self.dropped_lines, self.dropped_bytes))
            self.dropped_lines = self.dropped_bytes = 0
        return reason, None

    async def _put(self, batch: frames.Batch) -> None:
        if self._size >= self._limit and (self._dropping or not await self._wait_for_space()):
            self._dropping = True
            self.dropped_lines += batch.frames
            self.dropped_bytes += batch.payload_bytes
            return
        self._dropping = False
        if self.dropped_lines:
            self._put_now(frames.dropped_frame(self.dropped_lines, self.dropped_bytes))
            self.dropped_lines = self.dropped_bytes = 0
        self._put_now(batch.data)

    def _put_now(self, data: bytes) -> None:
        self._buffer.append(data)
        self._size += len(data)
        self._data.set()

    async def _wait_for_space(self) -> bool:
        """True once the buffer has room; False when it stayed full for the stall time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._stall
        while self._size >= self._limit:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._space.clear()
            try:
                await asyncio.wait_for(self._space.wait(), remaining)
            except asyncio.TimeoutError:
                return self._size < self._limit
        return True

    # ---- sender and watcher ----------------------------------------------------
    async def _send_all(self) -> None:
        """Runs of whole frames, up to about message_bytes per message; returns
        when the producer is done and everything went out."""
        buffer = self._buffer
        while True:
            while not buffer:
                if self._produced:
                    return
                self._data.clear()
                await self._data.wait()
            parts = [buffer.popleft()]
            size = len(parts[0])
            while buffer and size + len(buffer[0]) <= self._message_bytes:
                parts.append(buffer.popleft())
                size += len(parts[-1])
            self._size -= size
            if self._size < self._limit:
                self._space.set()
            await self._sink.send_bytes(parts[0] if len(parts) == 1 else b"".join(parts))

    async def _watch_peer(self) -> None:
        while await self._sink.receive() is not None:
            pass  # a log stream takes no input


def _outcome(producer: asyncio.Task) -> tuple[str, str | None]:
    if producer.cancelled():
        return "error", "cancelled"
    exc = producer.exception()
    if exc is None:
        return producer.result()
    if isinstance(exc, (EngineError, frames.LogFormatError)):
        return "error", str(exc)
    log.error("log_stream_failed", error=f"{type(exc).__name__}: {exc}")
    return "error", "internal error"


def _stamp(text: object) -> bytes | None:
    """Docker's FinishedAt as a timestamp to resume after; None for "never"."""
    if not isinstance(text, str) or text.startswith("0001-"):
        return None
    try:
        return frames.timestamp_key(text.encode())
    except ValueError:
        return None

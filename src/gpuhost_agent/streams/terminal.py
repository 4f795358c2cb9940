"""One terminal: an exec with a TTY, its bytes both ways (docs/streams.md, "Terminal").

The exec's connection is an asyncio stream (runtime.engine_streams), so a
terminal costs two small tasks and no thread. The TTY's output goes out as
it comes, in messages of what one read returns: a terminal is about latency,
and the TTY already batches. Closing the exec's connection does not end the
exec in the engine, so a session that ends any other way than by its command
exiting hangs the command up (runtime.exec_hangup).
"""

from __future__ import annotations

import asyncio
import json

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.streams.requests import TerminalRequest, parse_resize
from gpuhost_agent.streams.sink import Sink, finish

log = get_logger(__name__)

READ_BYTES = 64 * 1024
EXIT_CODE_WAIT = 5.0  # the engine records the exit code a moment after the TTY closes
TERM = "xterm"


class Terminal:
    def __init__(
        self,
        engine: EngineStreams,
        request: TerminalRequest,
        sink: Sink,
        *,
        container_id: str | None = None,
        exit_code_wait: float = EXIT_CODE_WAIT,
    ):
        self._engine = engine
        self._request = request
        self._sink = sink
        self._container = container_id or request.container_id
        self._exit_code_wait = exit_code_wait
        self._stop_reason: str | None = None
        self._stopped = asyncio.Event()
        self.exec_id: str | None = None

    def stop(self, reason: str) -> None:
        """End the session from outside (rental-ended, agent-stopping)."""
        if self._stop_reason is None:
            self._stop_reason = reason
            self._stopped.set()

    async def run(self) -> str:
        """Until the session ends; the reason ("closed": the peer left)."""
        request = self._request
        try:
            self.exec_id = await self._engine.exec_create(self._container, list(request.command), {"TERM": TERM})
            reader, writer = await self._engine.exec_start(self.exec_id)
        except EngineError as exc:
            return await finish(self._sink, {"type": "end", "reason": "error", "error": str(exc)})
        await self._resize(request.cols, request.rows)
        output = asyncio.create_task(self._output(reader))
        inputs = asyncio.create_task(self._input(writer))
        stopped = asyncio.create_task(self._stopped.wait())
        end: dict | None = None
        try:
            await asyncio.wait({output, inputs, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if stopped.done():
                end = {"type": "end", "reason": self._stop_reason}
            elif output.done() and not output.exception():  # the TTY closed: the command ended
                end = {"type": "end", "reason": "exited", "exitCode": await self._exit_code()}
        finally:
            writer.close()
            for task in (output, inputs, stopped):
                task.cancel()
            await asyncio.gather(output, inputs, stopped, return_exceptions=True)
        reason = await finish(self._sink, end)
        if reason != "exited":
            await self._hang_up()
        return reason

    async def _output(self, reader: asyncio.StreamReader) -> None:
        """Returns at the TTY's end; raises SinkClosed when the peer left."""
        while True:
            try:
                data = await reader.read(READ_BYTES)
            except OSError:
                return
            if not data:
                return
            await self._sink.send_bytes(data)

    async def _input(self, writer: asyncio.StreamWriter) -> None:
        """Keys to the TTY, resizes to the engine; returns when the peer closed."""
        while True:
            message = await self._sink.receive()
            if message is None:
                return
            if isinstance(message, bytes):
                try:
                    writer.write(message)
                    await writer.drain()
                except OSError:
                    return  # the TTY is gone; the output side ends the session
            else:
                try:
                    size = parse_resize(json.loads(message))
                except ValueError:
                    size = None
                if size is not None:
                    await self._resize(*size)

    async def _resize(self, cols: int, rows: int) -> None:
        if self.exec_id is None:
            return  # not started yet
        try:
            await self._engine.exec_resize(self.exec_id, rows=rows, cols=cols)
        except EngineError as exc:  # the exec may have ended meanwhile
            log.debug("terminal_resize_failed", error=str(exc))

    async def _hang_up(self) -> None:
        if self.exec_id is not None:  # never started: nothing to hang up
            await self._engine.hang_up(self.exec_id, self._container)

    async def _exit_code(self) -> int | None:
        if self.exec_id is None:
            return None
        return await self._engine.exec_exit_code(self.exec_id, self._exit_code_wait)

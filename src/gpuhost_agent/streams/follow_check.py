"""A follow that stopped delivering while its container still writes.

Docker 20.10's log follow can stop sending after a rotation when the reader
was behind (moby/moby#39235): the follow stays open, the container goes on
printing, and the renter sees nothing more. So a follow that has been silent
for a while is checked against the log itself: when the log holds a line
newer than the last one handed out, the follow is given up and opened again
from that line (the log pump's resume; the timestamps keep it free of
duplicates). A quiet container is the common case, so the check backs off:
an idle follow costs one small engine read a minute.
"""

from __future__ import annotations

import asyncio

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.streams import EngineStreams, LogReader
from gpuhost_agent.streams import frames

log = get_logger(__name__)

FOLLOW_CHECK_SECONDS = 10.0
FOLLOW_CHECK_MAX_SECONDS = 60.0


class FollowCheck:
    def __init__(self, engine: EngineStreams, check_seconds: float = FOLLOW_CHECK_SECONDS):
        self._engine = engine
        self._check = check_seconds
        self.restarts = 0  # follows found stalled, for tests and logs

    async def read(self, reader: LogReader, container: str, parser: frames.FrameParser | frames.RawParser) -> bytes:
        """The follow's next chunk, or b"" (as at the follow's end, so the
        pump follows again) when it is found stalled behind the log."""
        pending = asyncio.ensure_future(reader.read())
        wait = self._check
        try:
            while True:
                done, _ = await asyncio.wait({pending}, timeout=wait)
                if done:
                    return pending.result()
                if await self._log_is_ahead(container, parser):
                    self.restarts += 1
                    log.warning("log_follow_stalled", container_id=container[:12], restarts=self.restarts)
                    return b""
                wait = min(wait * 2, FOLLOW_CHECK_MAX_SECONDS)
        finally:
            pending.cancel()

    async def _log_is_ahead(self, container: str, parser: frames.FrameParser | frames.RawParser) -> bool:
        """Whether the log's last line is newer than the last one handed out."""
        mark = parser.last_timestamp
        if mark is None:
            return False
        probe = frames.parser_for(isinstance(parser, frames.RawParser), True)
        try:
            reader = await self._engine.open_logs(container, follow=False, tail=1, since=frames.since_param(mark))
            try:
                while chunk := await reader.read():
                    probe.feed(chunk)
            finally:
                reader.close()
        except EngineError:
            return False
        probe.flush()
        newest = probe.last_timestamp
        return newest is not None and newest > mark

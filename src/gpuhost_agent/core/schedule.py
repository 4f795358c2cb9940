"""Periodic work, declared in one place, with intervals the marketplace may change.

Each job has a name; calling `every` again with the same name reschedules it,
which is how an interval from the marketplace's session reply takes effect.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Awaitable, Callable

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from gpuhost_agent.common.logs import get_logger

log = get_logger(__name__)


class Schedule:
    def __init__(self) -> None:
        self._scheduler = AsyncIOScheduler(timezone="UTC")
        self.intervals: dict[str, float] = {}

    def every(self, name: str, seconds: float, work: Callable[[], Awaitable[object]], *, now: bool = False) -> None:
        """Run `work` every `seconds`; with now=True the first run is at once
        rather than one period from now."""
        if self.intervals.get(name) == seconds:
            return
        self.intervals[name] = seconds
        first = {"next_run_time": datetime.now(timezone.utc)} if now else {}
        self._scheduler.add_job(work, "interval", seconds=seconds, id=name, replace_existing=True,
                                max_instances=1, coalesce=True, misfire_grace_time=max(1, int(seconds)), **first)
        log.debug("periodic_work_scheduled", name=name, interval_s=seconds)

    def start(self) -> None:
        if not self._scheduler.running:
            self._scheduler.start()

    def stop(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

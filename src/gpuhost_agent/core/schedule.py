"""Periodic work, declared in one place, with intervals the marketplace may change.

Each job has a name; calling `every` again with the same name reschedules it,
which is how an interval from the marketplace's session reply takes effect.
Every job runs inside one guard (`guarded`), so a failing run is logged the
same way for all of them and never costs the job its next run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timezone

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from gpuhost_agent.common.logs import get_logger

log = get_logger(__name__)

Work = Callable[[], Awaitable[object]]  # what a run returns is not used


def guarded(name: str, work: Work) -> Work:
    """`work`, with an exception from a run logged once as periodic_work_failed
    (traceback included) instead of raised.  APScheduler would keep the job
    too, but in its own words; one event, the same for every job and carrying
    its name, is what an operator searches for, and call sites need no
    catch-all of their own.  CancelledError is a BaseException, not an
    Exception: it still propagates, so a shutdown cancels the run."""

    async def run() -> None:
        try:
            await work()
        except Exception:
            log.exception("periodic_work_failed", name=name)

    return run


class Schedule:
    def __init__(self) -> None:
        self._scheduler = AsyncIOScheduler(timezone="UTC")
        self.intervals: dict[str, float] = {}

    def every(self, name: str, seconds: float, work: Work, *, now: bool = False) -> None:
        """Run `work` every `seconds`; with now=True the first run is at once
        rather than one period from now."""
        if self.intervals.get(name) == seconds:
            return
        self.intervals[name] = seconds
        first = {"next_run_time": datetime.now(timezone.utc)} if now else {}
        self._scheduler.add_job(
            guarded(name, work),
            "interval",
            seconds=seconds,
            id=name,
            name=name,
            replace_existing=True,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, int(seconds)),
            **first,
        )
        log.debug("periodic_work_scheduled", name=name, interval_s=seconds)

    def start(self) -> None:
        if not self._scheduler.running:
            self._scheduler.start()

    def stop(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

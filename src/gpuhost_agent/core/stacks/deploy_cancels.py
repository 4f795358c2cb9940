"""A deploy that its stack's removal, or its rental's end, has overtaken.

Jobs of one stack run one at a time in arrival order, so a removal that
arrives while a deploy pulls a 20 GB image used to wait for the whole pull
(up to GPUHOST_PULL_MAX_SECONDS), and a rental's end waited for it too: the
renter who deleted the stack saw it APPLYING for minutes, and the next
renter waited for GPUs nobody was going to use. A deploy that a later
removal or end has overtaken has no reason to go on: it stops where
stopping leaves nothing half made, that is before it starts, while it waits
for a deploy slot, while it waits for GPUs an ended rental is releasing
(up to two minutes), and while its images are pulled (core/images/pulls.py
stops a pull no other deploy waits on). Once Compose's `up` runs, the
deploy finishes; the removal behind it takes down what it made.

Only jobs that arrived before the removal are stopped: a deploy sent after
it is the renter's next wish and runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from gpuhost_agent.core.stack_errors import StackFailed
from gpuhost_agent.errors import Stopped
from gpuhost_agent.protocol import wire, wire_jobs

T = TypeVar("T")


class DeployCancelled(Stopped, StackFailed):
    """The deploy was overtaken; the message says by what."""


class DeployCancels:
    """One stop signal per deploy job that has arrived and not finished."""

    def __init__(self) -> None:
        self._deploys: dict[str, tuple[wire_jobs.StackJob, asyncio.Event, list[str]]] = {}

    def arrived(self, job: wire_jobs.StackJob) -> None:
        """Every job, in arrival order: a deploy is registered, a removal or
        an end stops the deploys it overtakes."""
        if job.type == wire.JOB_DEPLOY:
            self._deploys[job.job_id] = (job, asyncio.Event(), [])
            return
        for deploy, stop, why in self._deploys.values():
            if job.type == wire.JOB_REMOVE and deploy.stack_id == job.stack_id:
                why.append("the stack's removal came before the deploy finished")
            elif job.type == wire.JOB_RENTAL_END and deploy.rental_id == job.rental_id:
                why.append("the rental ended before the deploy finished")
            else:
                continue
            stop.set()

    def finished(self, job: wire_jobs.StackJob) -> None:
        self._deploys.pop(job.job_id, None)

    def stop_signal(self, job: wire_jobs.StackJob) -> asyncio.Event:
        """The job's signal (a fresh, unset one for a job never registered)."""
        entry = self._deploys.get(job.job_id)
        return entry[1] if entry else asyncio.Event()

    def reason(self, job: wire_jobs.StackJob) -> str | None:
        """Why the deploy was stopped, or None while it may go on."""
        entry = self._deploys.get(job.job_id)
        if entry is None or not entry[1].is_set():
            return None
        return f"deploy stopped: {entry[2][0]}"

    def check(self, job: wire_jobs.StackJob) -> None:
        """DeployCancelled when the job was overtaken."""
        if reason := self.reason(job):
            raise DeployCancelled(reason)

    async def unless_stopped(self, job: wire_jobs.StackJob, work: Awaitable[T]) -> T:
        """`work`'s result, or DeployCancelled (with `work` cancelled, and
        awaited to its end) when the job is overtaken first."""
        self.check(job)
        task = asyncio.ensure_future(work)
        stopped = asyncio.ensure_future(self.stop_signal(job).wait())
        try:
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if task.cancelled():
            self.check(job)
        return task.result()

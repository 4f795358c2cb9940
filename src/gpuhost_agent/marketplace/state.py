"""The store plus what the HTTP handlers share: saving, and waking long polls."""

from __future__ import annotations

import asyncio
import uuid

from .store import Job, Store

DEFAULT_INTERVALS = {"jobPollWaitSeconds": 25, "containerResyncSeconds": 15}


class MarketplaceState:
    def __init__(self, store: Store, intervals: dict | None = None):
        self.store = store
        self.intervals = {**DEFAULT_INTERVALS, **(intervals or {})}
        self.session_id: str | None = None
        self.polls_started = 0
        self._jobs_posted = asyncio.Event()

    def changed(self, *, jobs: bool = False) -> None:
        """Persist, and if new jobs were queued wake every waiting long poll."""
        self.store.save()
        if jobs:
            self._jobs_posted.set()
            self._jobs_posted = asyncio.Event()

    def new_session(self) -> tuple[str, int]:
        self.session_id = str(uuid.uuid4())
        requeued = self.store.requeue_unfinished()
        self.changed(jobs=bool(requeued))
        return self.session_id, requeued

    async def wait_for_jobs(self, wait_seconds: float, max_jobs: int) -> list[Job]:
        """Jobs as soon as there are any, else an empty list after wait_seconds."""
        self.polls_started += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        while True:
            event = self._jobs_posted
            jobs = self.store.deliverable(max_jobs)
            if jobs:
                self.store.save()
                return jobs
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                return []

    def redeliver(self, job_id: str) -> None:
        """Hand a job out again as a lossy network would (used by tests and by
        operators who want an agent to redo a job)."""
        job = self.store.jobs[job_id]
        job.state = "queued"
        self.changed(jobs=True)

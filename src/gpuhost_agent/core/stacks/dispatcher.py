"""Turns received jobs into deploy/remove runs: at most once at a time per stack,
in arrival order, and each job id acted on once however often it is delivered.

Delivery is at-least-once, so duplicates are normal: a job already running is
ignored, a job already finished has its completion sent again (the marketplace
evidently missed it) without running again. Finished jobs are remembered in the
state database, so this holds across agent restarts too; a job that was
running when the agent died is simply run again (deploy and remove converge).

Reconcile submits its own work as internal jobs: the same per-stack order and
locks, but no completion is sent for them (the marketplace never issued them).

At most `deploy_concurrency` deploys run at once (GPUHOST_DEPLOY_CONCURRENCY),
one fewer for any one rental (deploy_turns.py):
each runs two Compose processes and makes networks and containers, and twenty
renters creating stacks in the same second, or a reconcile after a restart,
must not start them all together on a machine whose cores the renters' own
work needs. A deploy waiting for its turn is APPLYING with a reason that says
so. Removals and rental ends are not held back: they free what waiting
deploys may need (a GPU being released). A deploy they overtake stops early,
while it waits or pulls (deploy_stops.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import structlog
from prometheus_client import Histogram

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.rentals.end_dates import RentalEndDates
from gpuhost_agent.core.stacks.deploy_cancels import DeployCancelled, DeployCancels
from gpuhost_agent.core.stacks.deploy_limits import DeployLimits
from gpuhost_agent.core.stacks.deployer import StackDeployer
from gpuhost_agent.core.stacks.status_reporter import StackRef, StatusReporter
from gpuhost_agent.protocol import wire, wire_jobs, wire_time, wire_values
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.outbox import JOB_COMPLETE, Outbox

log = get_logger(__name__)


class JobDispatcher:
    def __init__(
        self,
        deployer: StackDeployer,
        reporter: StatusReporter,
        outbox: Outbox,
        db: AgentDB,
        end_dates: RentalEndDates,
        on_rental_end: Callable[[str], Awaitable[None]],
        deploy_durations: Histogram,
        deploy_concurrency: int,
    ):
        """`on_rental_end` runs before a rental's end job (the stream channel
        ends the rental's terminals and log streams there); `deploy_durations`
        is observed at the end of every deploy, by outcome (service/metrics.py)."""
        self.deployer = deployer
        self.reporter = reporter
        self.outbox = outbox
        self.db = db
        self.end_dates = end_dates
        self.on_rental_end = on_rental_end
        self._running: dict[str, asyncio.Task] = {}
        self._stacks_busy: Counter[str] = Counter()  # submitted, unfinished jobs per stack
        self._internal: set[str] = set()  # ids of running jobs that reconcile made up
        self._stack_locks: dict[str, asyncio.Lock] = {}  # while the stack has unfinished jobs
        self._rental_jobs: Counter[str] = Counter()  # stack jobs of each rental not yet finished
        self._rentals_ending: Counter[str] = Counter()  # rental.end jobs not yet finished
        self.duplicates_ignored = 0
        self.outcomes: Counter[str] = Counter()  # marketplace jobs finished since start, for the metrics
        self.deploy_durations = deploy_durations
        self.deploy_concurrency = deploy_concurrency
        self._turns = DeployLimits(deploy_concurrency)
        self._stops = DeployCancels()  # a deploy that a later removal or rental end overtook stops early

    def submit(self, raw: object) -> None:
        raw_id = raw.get("jobId") if isinstance(raw, dict) else None
        try:
            job = wire_jobs.StackJob.from_wire(raw)
        except wire_jobs.InvalidBody as exc:
            self._refuse(raw, raw_id, str(exc))
            return
        except Exception as exc:  # a decoder's bug refuses this job, never the poll loop with the others
            log.exception("job_decode_failed", job_id=wire_values.clipped(str(raw_id)) if raw_id else None)
            self._refuse(raw, raw_id, f"the job could not be decoded ({type(exc).__name__})")
            return
        if job.rental_end:  # a job without an end says nothing of it (the desired state can clear one)
            self.end_dates.note(job.rental_id, job.rental_end)
        if job.job_id in self._running:
            self.duplicates_ignored += 1
            log.info("job_duplicate_ignored", job_id=job.job_id, stack_id=job.stack_id, state="running")
            return
        completion = self.db.completion(job.job_id)
        if completion is not None:
            self.duplicates_ignored += 1
            log.info("job_duplicate_ignored", job_id=job.job_id, stack_id=job.stack_id, state="finished")
            self.outbox.put(JOB_COMPLETE, job.job_id, completion)
            return
        owner = self.db.stack_rental(job.stack_id) if job.stack_id else None
        if owner is not None and owner != job.rental_id:
            # Another rental's stack (its Compose project, its volumes): the job is answered,
            # the stack and its status are left as they are.
            reason = f"stack {job.stack_id} belongs to another rental than {job.rental_id}"
            log.warning("job_refused", job_id=job.job_id, stack_id=job.stack_id, rental_id=job.rental_id, error=reason)
            self._finish(job.job_id, f"job refused by the agent: {reason}")
            return
        self._start(job)

    def submit_internal(self, job: wire_jobs.StackJob) -> None:
        """Work that reconcile decided on, queued behind the stack's other jobs."""
        self._internal.add(job.job_id)
        self._start(job)

    def busy_stacks(self) -> set[str]:
        return {stack_id for stack_id, count in self._stacks_busy.items() if count}

    def running_jobs(self) -> int:
        return len(self._running)

    def busy_rentals(self) -> set[str]:
        return set(self._rental_jobs) | set(self._rentals_ending)

    def ending_rentals(self) -> set[str]:
        """Rentals whose end job runs: it stops their stacks without a job per stack."""
        return {rental_id for rental_id, count in self._rentals_ending.items() if count}

    def stats(self) -> dict[str, object]:
        """Marketplace jobs finished since the agent started, by outcome, and
        those running now (deploys waiting for a slot among them)."""
        return {
            "running": self.running_jobs(),
            "deploysWaiting": self._turns.waiting,
            "deployConcurrency": self.deploy_concurrency,
            "outcomes": {str(k): int(v) for k, v in self.outcomes.items()},
            "duplicatesIgnored": self.duplicates_ignored,
        }

    def _rental_counter(self, job: wire_jobs.StackJob) -> Counter[str]:
        return self._rentals_ending if job.type == wire.JOB_RENTAL_END else self._rental_jobs

    def _start(self, job: wire_jobs.StackJob) -> None:
        if job.type == wire.JOB_RENTAL_END:
            self.deployer.rental_ending(job.rental_id)
        self._stops.arrived(job)
        self._rental_counter(job)[job.rental_id] += 1
        self._stacks_busy[job.stack_id] += 1
        if job.job_id not in self._internal:
            self.db.job_started(job)
        task = asyncio.create_task(self._run(job), name=f"job-{job.job_id}")
        self._running[job.job_id] = task
        task.add_done_callback(partial(self._job_task_done, job))

    def _job_task_done(self, job: wire_jobs.StackJob, _task: asyncio.Task) -> None:
        self._done(job)

    def _done(self, job: wire_jobs.StackJob) -> None:
        self._running.pop(job.job_id, None)
        self._stops.finished(job)
        self._internal.discard(job.job_id)
        _decrement(self._rental_counter(job), job.rental_id)
        if not _decrement(self._stacks_busy, job.stack_id):
            self._stack_locks.pop(job.stack_id, None)  # no job of the stack holds or awaits it

    async def _run(self, job: wire_jobs.StackJob) -> None:
        # Every line logged while this job runs (deployer, Compose, sandbox)
        # carries its ids and a request id of this run, which tells apart two
        # runs of the same job (a redelivery after a restart); operators follow
        # a job with `jq 'select(.request_id=="...")'` (docs/operations.md).
        context = {"job_id": job.job_id, "rental_id": job.rental_id, "request_id": uuid.uuid4().hex[:12]}
        if job.stack_id:
            context["stack_id"] = job.stack_id
        with structlog.contextvars.bound_contextvars(**context):
            await self._run_bound(job)

    async def _run_bound(self, job: wire_jobs.StackJob) -> None:
        if job.type == wire.JOB_RENTAL_END:
            await self._run_rental_end(job)
        else:
            await self._run_stack_job(job)

    async def _run_rental_end(self, job: wire_jobs.StackJob) -> None:
        """Only once the rental's own stack jobs (its removals) are done. The
        rental's terminals and log streams end first, at once: a renter must
        not keep a shell while the stacks are taken down."""
        try:
            await self.on_rental_end(job.rental_id)
        except Exception:  # ending streams must never keep the rental from ending
            log.exception("rental_end_hook_failed", rental_id=job.rental_id)
        while self._rental_jobs.get(job.rental_id):  # noqa: ASYNC110 - a short poll; the counter signals nothing
            await asyncio.sleep(0.05)
        error = await self._execute(job)
        self._finish(job.job_id, error)

    async def _run_stack_job(self, job: wire_jobs.StackJob) -> None:
        async with self._stack_locks.setdefault(job.stack_id, asyncio.Lock()):
            if job.type == wire.JOB_DEPLOY:
                try:
                    async with self._deploy_turn(job):
                        started = time.monotonic()
                        error = await self._execute(job)
                except DeployCancelled as exc:  # overtaken before it started: nothing of it to take down
                    error = str(exc)
                    log.info("deploy_stopped", job_id=job.job_id, stack_id=job.stack_id, reason=error)
                else:
                    outcome = wire.OUTCOME_FAILED if error else wire.OUTCOME_SUCCEEDED
                    self.deploy_durations.labels(outcome=outcome).observe(time.monotonic() - started)
            else:
                error = await self._execute(job)
        self._finish(job.job_id, error)
        log.info(
            "job_finished",
            job_id=job.job_id,
            stack_id=job.stack_id,
            outcome=wire.OUTCOME_FAILED if error else wire.OUTCOME_SUCCEEDED,
        )

    @contextlib.asynccontextmanager
    async def _deploy_turn(self, job: wire_jobs.StackJob) -> AsyncIterator[None]:
        """A deploy turn for the block (deploy_turns.py); when none is free the
        stack says why it waits. DeployCancelled when a removal or rental end
        overtook it first."""
        self._stops.check(job)

        def waiting(reason: str) -> None:
            self.reporter.status(StackRef.of_job(job), wire.APPLYING, reason, job_id=job.job_id)
            log.info("deploy_waiting_for_turn", job_id=job.job_id, stack_id=job.stack_id)

        async with self._turns.turn(job.rental_id, waiting, partial(self._stops.unless_stopped, job)):
            yield

    async def _execute(self, job: wire_jobs.StackJob) -> str:
        log.info("job_started", job_id=job.job_id, job_type=job.type, stack_id=job.stack_id, rental_id=job.rental_id)
        try:
            if job.type == wire.JOB_DEPLOY:
                return await self.deployer.deploy(job, self._stops)
            if job.type == wire.JOB_RENTAL_END:
                return await self.deployer.end_rental(job)
            return await self.deployer.remove(job)
        except asyncio.CancelledError:
            log.warning("job_abandoned", job_id=job.job_id, stack_id=job.stack_id)
            raise
        except Exception as exc:  # a bug must not kill the agent; the renter still gets an answer
            log.exception("job_crashed", job_id=job.job_id, stack_id=job.stack_id)
            error = f"internal agent error: {type(exc).__name__}"
            if job.stack_id:
                self.reporter.status(StackRef.of_job(job), wire.ERROR, error, job_id=job.job_id)
            return error

    def _finish(self, job_id: str, error: str) -> None:
        if job_id in self._internal:
            return
        outcome = wire.OUTCOME_FAILED if error else wire.OUTCOME_SUCCEEDED
        body = {"outcome": outcome, "errorMsg": error or None, "finishedAt": wire_time.iso()}
        self.outcomes[outcome] += 1
        self.db.job_finished(job_id, body)
        self.outbox.put(JOB_COMPLETE, job_id, body)

    def _refuse(self, raw: object, raw_id: object, reason: str) -> None:
        """A job we cannot act on is answered, not dropped: the marketplace learns why."""
        log.warning("job_refused", job_id=raw_id if isinstance(raw_id, str) else None, error=reason)
        if not wire_values.is_safe_id(raw_id):
            return
        if raw_id in self._running or self.db.completion(raw_id) is not None:
            return  # a garbled copy of a job we have: its own outcome stands
        stack_id = raw.get("stackId") if isinstance(raw, dict) else None
        if wire_values.is_safe_id(stack_id):
            self.reporter.refusal(stack_id, f"job refused by the agent: {reason}", job_id=raw_id)
        self._finish(raw_id, f"job refused by the agent: {reason}")

    async def shutdown(self, timeout: float) -> None:
        """Let running jobs finish for a while, then cancel what is left. Renters'
        containers are never touched here; a cancelled job is redelivered."""
        tasks = list(self._running.values())
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)


def _decrement(counter: Counter[str], key: str) -> int:
    """One less; a key that reaches zero is dropped. Returns what is left."""
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
        return 0
    return counter[key]

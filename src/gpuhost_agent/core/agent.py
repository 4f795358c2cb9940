"""The agent's main loop: open a session, long-poll for jobs, hand them on.

A job waiting in the marketplace is answered by the open long poll at once, so
pickup takes a round trip, not a timer period. Losing the marketplace is not an
error state: the loop backs off and tries again, and reports wait in the outbox.
"""

from __future__ import annotations

import asyncio
import socket
import time

from gpuhost_agent import __version__
from gpuhost_agent.protocol import wire
from gpuhost_agent.uplink.client import MarketplaceClient, MarketplaceRejected, MarketplaceUnavailable, retry_delay
from gpuhost_agent.core.deployer import StackDeployer
from gpuhost_agent.core.dispatcher import JobDispatcher
from gpuhost_agent.core.container_watch import ContainerWatch
from gpuhost_agent.core.reconciler import Reconciler
from gpuhost_agent.core.rental_clock import RentalClock
from gpuhost_agent.core.host_reporter import HostReporter
from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.uplink.outbox import CONTAINERS, INIT_STATE, JOB_COMPLETE, STATUS, SYSTEM_DATA, Outbox, Report
from gpuhost_agent.runtime.engine_watch import EngineWatch
from gpuhost_agent.core.schedule import Schedule
from gpuhost_agent.streams.channel import StreamChannel

log = get_logger(__name__)


class Agent:
    def __init__(self, client: MarketplaceClient, deployer: StackDeployer, outbox: Outbox, dispatcher: JobDispatcher,
                 schedule: Schedule, host: HostReporter | None = None):
        self.client = client
        self.host = host
        self.deployer = deployer
        self.outbox = outbox
        self.dispatcher = dispatcher
        self.schedule = schedule
        self.intervals: dict = {"jobPollWaitSeconds": 25, "containerResyncSeconds": 15, "reconcileSeconds": 60}
        self.connected = asyncio.Event()
        self.connected_since: str | None = None
        self.reconnects = 0
        self.env_id: str | None = None
        self._pushed: dict[str, list] = {}  # the last list pushed per stack, shared with the event path
        self.container_watch = ContainerWatch(deployer, dispatcher, self._pushed) if deployer is not None else None
        self.reconciler: Reconciler | None = None
        self.rental_clock: RentalClock | None = None
        self.engine_watch: EngineWatch | None = None
        self.streams: StreamChannel | None = None

    def attach_durability(self, reconciler: Reconciler, rental_clock: RentalClock, engine_watch: EngineWatch) -> None:
        """Reconcile, rental ends by the host's clock, and engine restarts.
        The environment id of the last session is remembered, so rentals end
        on time even when the agent restarts while the marketplace is away."""
        self.reconciler, self.rental_clock, self.engine_watch = reconciler, rental_clock, engine_watch
        self.env_id = reconciler.db.meta("env_id")
        engine_watch.on_back(self._engine_back)
        # A job without an end says nothing of it (the desired state can clear one).
        self.dispatcher.on_job = lambda job: job.rental_end and rental_clock.end_date(job.rental_id, job.rental_end)
        for job in reconciler.db.interrupted:
            log.warning("job_interrupted_by_restart", job_id=job["job_id"], job_type=job["type"],
                        stack_id=job["stack_id"] or None, rental_id=job["rental_id"],
                        hint="the marketplace hands it out again; reconcile checks its stack")

    def attach_streams(self, channel: StreamChannel) -> None:
        """Logs and terminals on demand (docs/streams.md). A rental's end, from
        the marketplace or from the host's clock, ends its streams first."""
        self.streams = channel
        self.dispatcher.on_rental_end = channel.end_rental

    async def run(self) -> None:
        background = [asyncio.create_task(self.outbox.run(), name="outbox")]
        if self.rental_clock and self.engine_watch:
            background += [asyncio.create_task(self.rental_clock.run(), name="rental-clock"),
                           asyncio.create_task(self.engine_watch.run(), name="engine-watch")]
        self.schedule.every("container_resync", self.intervals["containerResyncSeconds"], self.resync_containers)
        self.schedule.start()
        self._follow_containers()
        try:
            if self.host:
                self.host.init.begin("config")
                self.host.init.done("config")
                self.host.init.begin("marketplace")
            await self._open_session()
            if self.streams:  # it needs the session's header; it reopens by itself from now on
                background.append(asyncio.create_task(self.streams.run(), name="stream-channel"))
            if self.host:
                await self.host.bring_up()
            if self.reconciler:
                self.schedule.every("reconcile", self.intervals["reconcileSeconds"], self.reconcile, now=True)
            await self._poll_forever()
        finally:
            self.schedule.stop()
            if self.container_watch:
                self.container_watch.stop()
            if self.streams:
                await self.streams.close()  # every stream ends with agent-stopping
            if self.host:
                await self.host.stop()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def reconcile(self) -> None:
        try:
            await self.reconciler.run_once()
        except Exception:  # a bug in one run must not stop the next
            log.exception("reconcile_failed")

    async def _engine_back(self, last_up, back) -> None:
        self.reconciler.engine_restarted(last_up, back)
        self._pushed.clear()  # every list again: what the marketplace has may be stale
        if self.container_watch:
            self.container_watch.engine_back()  # the event stream broke with the engine
        await self.resync_containers()
        await self.reconcile()

    async def _open_session(self) -> None:
        failures = 0
        info = {"agentVersion": __version__, "hostname": socket.gethostname(), "startedAt": wire.iso(),
                "capabilities": list(wire.JOB_TYPES)}
        while True:
            try:
                sent_at = time.time()
                reply = await self.client.open_session(info)
                break
            except (MarketplaceUnavailable, MarketplaceRejected) as exc:
                failures += 1
                delay = retry_delay(failures, exc)
                if self.host:
                    self.host.init.failed("marketplace", str(exc))
                log.warning("session_open_failed", error=str(exc), retry_in_s=round(delay, 1))
                await asyncio.sleep(delay)
        self.intervals.update({k: v for k, v in (reply.get("intervals") or {}).items()
                               if wire.is_number(v) and v > 0})
        self.schedule.every("container_resync", self.intervals["containerResyncSeconds"], self.resync_containers)
        self.env_id = reply.get("envId") if wire.is_safe_id(reply.get("envId")) else self.env_id
        if self.reconciler and self.env_id:
            self.reconciler.db.set_meta("env_id", self.env_id)
        self._follow_containers()
        if self.host:
            self.host.session_opened(reply, sent_at, time.time())
            self.host.init.done("marketplace", f"session {reply.get('sessionId')}")
        self.connected_since = wire.iso()
        self.connected.set()
        log.info("session_opened", session_id=reply.get("sessionId"), env_id=reply.get("envId"),
                 requeued_jobs=reply.get("requeuedJobs", 0))

    async def _poll_forever(self) -> None:
        failures = 0
        while True:
            try:
                jobs = await self.client.poll_jobs(self.intervals["jobPollWaitSeconds"])
            except MarketplaceUnavailable as exc:
                failures += 1
                self.connected.clear()
                self.connected_since = None
                delay = retry_delay(failures, exc)
                log.warning("job_poll_failed", error=str(exc), retry_in_s=round(delay, 1))
                await asyncio.sleep(delay)
                continue
            except MarketplaceRejected as exc:
                failures += 1
                self.connected.clear()
                self.connected_since = None
                delay = max(10.0, retry_delay(failures))
                log.error("job_poll_rejected", error=str(exc), retry_in_s=round(delay, 1),
                          hint="the marketplace refused the poll request itself")
                await asyncio.sleep(delay)
                continue
            if failures:
                log.info("marketplace_reachable_again", after_failures=failures)
                failures = 0
                self.reconnects += 1
                self.connected_since = wire.iso()
                self.connected.set()
            for raw in jobs:
                self.dispatcher.submit(raw)

    def _follow_containers(self) -> None:
        """Follow Docker's events for this environment's containers, once its id is known."""
        if self.container_watch and self.env_id:
            self.container_watch.follow(self.env_id)

    async def resync_containers(self) -> None:
        """Push the container list of every stack whose containers changed since
        the last push: the safety net under the event stream (a missed event,
        a stream re-opened late)."""
        if self.container_watch:
            await self.container_watch.resync(self.env_id)


async def send_report(client: MarketplaceClient, report: Report) -> None:
    """Outbox sender: one report kind, one protocol call."""
    if report.kind == STATUS:
        await client.put_stack_status(report.target, report.body)
    elif report.kind == CONTAINERS:
        await client.put_containers(report.target, report.body)
    elif report.kind == JOB_COMPLETE:
        await client.complete_job(report.target, report.body)
    elif report.kind == SYSTEM_DATA:
        await client.put_system_data(report.body)
    elif report.kind == INIT_STATE:
        await client.put_init_state(report.body)
    else:
        raise ValueError(f"unknown report kind {report.kind!r}")

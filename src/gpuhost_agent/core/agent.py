"""The agent's main loop: open a session, long-poll for jobs, hand them on.

A job waiting in the marketplace is answered by the open long poll at once, so
pickup takes a round trip, not a timer period. Losing the marketplace is not an
error state: the loop backs off and tries again, and reports wait in the outbox.

Every collaborator comes in through the constructor, from the composition root
(service/wiring.py); this class starts and stops them in order and owns only
the session and the poll.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuhost_agent import __version__
from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.containers.watch import ContainerWatch
from gpuhost_agent.core.disk_watch import DiskWatch
from gpuhost_agent.core.egress_keeper import EgressKeeper
from gpuhost_agent.core.host_reporter import HostReporter
from gpuhost_agent.core.reconcile.reconciler import Reconciler
from gpuhost_agent.core.rental_clock import RentalClock
from gpuhost_agent.core.rentals.usage_meter import UsageMeter
from gpuhost_agent.core.schedule import Schedule
from gpuhost_agent.core.stacks.dispatcher import JobDispatcher
from gpuhost_agent.inventory.gpu_events import GpuEventWatch
from gpuhost_agent.protocol import intervals as wire_intervals
from gpuhost_agent.protocol import wire, wire_time, wire_values
from gpuhost_agent.protocol.wire_replies import OfferingReply
from gpuhost_agent.runtime.engine.watch import EngineWatch
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.streams.channel import StreamChannel
from gpuhost_agent.uplink.client import MarketplaceClient, retry_delay
from gpuhost_agent.uplink.outbox import Outbox
from gpuhost_agent.uplink.replies import MarketplaceAuthFailed, MarketplaceRejected, MarketplaceUnavailable
from gpuhost_agent.uplink.session import SessionState

log = get_logger(__name__)
SUPERSEDED_WINDOW = 600.0  # superseded twice within this: another agent uses the key
SUPERSEDED_BACKOFF, SUPERSEDED_BACKOFF_MAX = 30.0, 600.0


class PeriodicWatch(Protocol):
    """Something the agent polls on its schedule, and stops at shutdown."""

    name: str
    interval: float

    async def poll(self) -> None: ...

    async def stop(self) -> None: ...


class ReleaseOffers(Protocol):
    """The agent's upgrades (service/upgrades.py): what a session opening
    says of them, and a session reply's offer, acted on in the background."""

    def session_info(self) -> dict[str, object]: ...

    def offered(self, reply: OfferingReply) -> None: ...


@dataclass(frozen=True, kw_only=True)
class MarketplaceSide:
    """What the agent talks with the marketplace through: the client (the
    session, the long poll), the session's state, the reports' outbox, the
    stream channel (logs, terminals, SSH), and the upgrades a session offers."""

    client: MarketplaceClient
    session: SessionState
    outbox: Outbox
    streams: StreamChannel
    releases: ReleaseOffers


@dataclass(frozen=True, kw_only=True)
class AgentDuties:
    """What the agent runs: the jobs (dispatcher), the reconcile, the rentals'
    ends on time (rental_clock), the heartbeats and start-up steps (host), on
    its schedule, over the state database."""

    db: AgentDB
    dispatcher: JobDispatcher
    schedule: Schedule
    host: HostReporter
    reconciler: Reconciler
    rental_clock: RentalClock


@dataclass(frozen=True, kw_only=True)
class AgentWatchers:
    """What watches the machine, on events or the schedule: the engine,
    the containers, the disk, the GPUs' faults, their use (usage), the
    containers' egress (none: not confined), and `watches`, the environment's
    own (a Swarm leader's look at the other machines; none on one machine)."""

    engine_watch: EngineWatch
    container_watch: ContainerWatch
    disk_watch: DiskWatch
    gpu_events: GpuEventWatch
    usage: UsageMeter
    egress: EgressKeeper | None = None
    watches: Sequence[PeriodicWatch] = ()


class Agent:
    def __init__(self, *, marketplace: MarketplaceSide, duties: AgentDuties, watchers: AgentWatchers):
        """Its collaborators in three parts, given by keyword, so the
        composition root says what each one is; the agent starts and stops them."""
        self.client = marketplace.client
        self.session = marketplace.session
        self.db = duties.db
        self.dispatcher = duties.dispatcher
        self.outbox = marketplace.outbox
        self.schedule = duties.schedule
        self.host = duties.host
        self.reconciler = duties.reconciler
        self.rental_clock = duties.rental_clock
        self.engine_watch = watchers.engine_watch
        self.container_watch = watchers.container_watch
        self.streams = marketplace.streams
        self.disk_watch = watchers.disk_watch
        self.gpu_events = watchers.gpu_events
        self.usage = watchers.usage
        self.releases = marketplace.releases
        self.egress = watchers.egress
        self.watches = list(watchers.watches)
        self._superseded_at: list[float] = []  # loop times our session was superseded, within the window
        self.intervals = wire_intervals.from_reply(None)
        for job in self.db.interrupted:
            log.warning(
                "job_interrupted_by_restart",
                job_id=job["job_id"],
                job_type=job["type"],
                stack_id=job["stack_id"] or None,
                rental_id=job["rental_id"],
                hint="the marketplace hands it out again; reconcile checks its stack",
            )

    async def run(self) -> None:
        background = [
            asyncio.create_task(self.outbox.run(), name="outbox"),
            asyncio.create_task(self.rental_clock.run(), name="rental-clock"),
            asyncio.create_task(self.engine_watch.run(), name="engine-watch"),
        ]
        self.schedule.every("container_resync", self.intervals["containerResyncSeconds"], self.resync_containers)
        # counted from the start: GPU time runs on while the marketplace is away
        self.schedule.every("usage", self.usage.interval, self.usage.tick, now=True)
        if self.egress:  # before anything runs or is reported: the last run's containers confined at once
            await self.egress.run_once()
            self.schedule.every("egress", self.egress.interval, self.egress.run_once)
        self.schedule.start()
        self._follow_containers()
        try:
            self.host.init.begin("config")
            self.host.init.done("config")
            self.host.init.begin("marketplace")
            await self._open_session()
            # it needs the session's header; it reopens by itself from now on
            background.append(asyncio.create_task(self.streams.run(), name="stream-channel"))
            await self.host.bring_up()
            self.gpu_events.start()
            self.schedule.every("reconcile", self.intervals["reconcileSeconds"], self.reconciler.run_once, now=True)
            self.schedule.every("disk_watch", self.disk_watch.interval, self.disk_watch.run_once)
            for watch in self.watches:
                self.schedule.every(watch.name, watch.interval, watch.poll)
            await self._poll_forever()
        finally:
            await self.gpu_events.stop()
            self.schedule.stop()
            for watch in self.watches:
                await watch.stop()
            self.container_watch.stop()
            await self.streams.close()  # every stream ends with agent-stopping
            await self.host.stop()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def _open_session(self) -> None:
        failures = 0
        info = {
            "agentVersion": __version__,
            "hostname": socket.gethostname(),
            "startedAt": wire_time.iso(),
            "capabilities": list(wire.JOB_TYPES),
            **self.streams.session_info(),
            **self.releases.session_info(),
        }
        while True:
            try:
                sent_at = time.time()
                reply = await self.client.open_session(info)
                break
            except (MarketplaceUnavailable, MarketplaceRejected) as exc:
                failures += 1
                delay = retry_delay(failures, exc)
                away = isinstance(exc, MarketplaceUnavailable) and not isinstance(exc, MarketplaceAuthFailed)
                self.session.unreachable = str(exc) if away else None  # a refused key is not an outage
                self.host.init.failed("marketplace", str(exc))
                log.warning("session_open_failed", error=str(exc), retry_in_s=round(delay, 1))
                await asyncio.sleep(delay)
        self.intervals = wire_intervals.from_reply(reply.get("intervals"))
        for problem in wire_intervals.problems(reply.get("intervals")):
            log.warning("session_interval_refused", error=problem)
        self.schedule.every("container_resync", self.intervals["containerResyncSeconds"], self.resync_containers)
        env_id = reply.get("envId") if wire_values.is_safe_id(reply.get("envId")) else self.session.env_id
        if env_id:
            self.db.set_meta("env_id", env_id)
            self.container_watch.follow(env_id)
        self.host.session_opened(reply, self.intervals, sent_at, time.time())
        self.host.init.done("marketplace", f"session {reply.get('sessionId')}")
        self.session.opened(env_id)
        log.info(
            "session_opened",
            session_id=reply.get("sessionId"),
            env_id=reply.get("envId"),
            requeued_jobs=reply.get("requeuedJobs", 0),
        )
        self.releases.offered(reply)

    async def _poll_forever(self) -> None:
        failures = 0
        while True:
            try:
                jobs = await self.client.poll_jobs(self.intervals["jobPollWaitSeconds"])
            except MarketplaceUnavailable as exc:
                failures += 1
                self.session.lost()
                delay = retry_delay(failures, exc)
                log.warning("job_poll_failed", error=str(exc), retry_in_s=round(delay, 1))
                await asyncio.sleep(delay)
                continue
            except MarketplaceRejected as exc:
                if exc.status == 409:  # our session was superseded by a newer one
                    await self._superseded(str(exc))
                    continue
                failures += 1
                self.session.lost()
                delay = max(10.0, retry_delay(failures))
                log.error(
                    "job_poll_rejected",
                    error=str(exc),
                    retry_in_s=round(delay, 1),
                    hint="the marketplace refused the poll request itself",
                )
                await asyncio.sleep(delay)
                continue
            if failures:
                log.info("marketplace_reachable_again", after_failures=failures)
                failures = 0
                self.session.back()
            if self.session.conflict and self._superseded_at:
                if asyncio.get_running_loop().time() - self._superseded_at[-1] > SUPERSEDED_WINDOW:
                    self.session.conflict = None  # held long enough: the other agent is gone
                    log.info("environment_key_conflict_over")
            for raw in jobs:
                try:
                    self.dispatcher.submit(raw)
                except Exception:  # one job's failure costs neither the others nor the loop
                    log.exception("job_submit_failed", hint="the job is left to the marketplace's next delivery")

    async def _superseded(self, why: str) -> None:
        """A newer session took this key's place: ours is opened again. Once
        more within SUPERSEDED_WINDOW means another live agent uses the same
        key; taking turns would starve both (each poll of one ends the
        other's), so the agent backs off, growing, and says so as an error an
        operator sees in `gpuhost-agent status`."""
        now = asyncio.get_running_loop().time()
        self._superseded_at = [at for at in self._superseded_at if now - at < SUPERSEDED_WINDOW] + [now]
        self.session.lost()
        if len(self._superseded_at) > 1:
            delay = min(SUPERSEDED_BACKOFF_MAX, SUPERSEDED_BACKOFF * 2 ** (len(self._superseded_at) - 2))
            self.session.conflict = "another agent uses this environment's key"
            log.error(
                "another_agent_on_key",
                error=why,
                retry_in_s=delay,
                hint="stop the other agent, or give each machine an environment (and key) of its own",
            )
            await asyncio.sleep(delay)
        else:
            log.error("session_superseded", error=why, hint="opening a new session")
        await self._open_session()

    def _follow_containers(self) -> None:
        """Follow Docker's events for this environment's containers, once its id is known."""
        if self.session.env_id:
            self.container_watch.follow(self.session.env_id)

    async def resync_containers(self) -> None:
        """Push the container list of every stack whose containers changed since
        the last push: the safety net under the event stream (a missed event,
        a stream re-opened late)."""
        await self.container_watch.resync(self.session.env_id)

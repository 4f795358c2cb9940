"""Reconcile: gather the picture (marketplace, Docker, own record), plan, act.

Runs at start, on a schedule, after the Docker Engine comes back, and whenever
someone asks (`kick`). The decisions are in reconcile_plan; this module only
fetches and carries out. Its work goes through the job dispatcher as internal
jobs, so it queues behind (and never races) the marketplace's own jobs for the
same stack.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.reconcile.desired_state import DesiredState, decode
from gpuhost_agent.core.reconcile.plan import DEPLOY, END_RENTAL, REPORT, Action, Picture, SeenStack, plan
from gpuhost_agent.core.rentals.end_dates import RentalEndDates, dates_of_this_host
from gpuhost_agent.core.sandbox.harden import GPU_LABEL
from gpuhost_agent.core.stacks import naming
from gpuhost_agent.core.stacks.deployer import COMPOSE_PROJECT_LABEL
from gpuhost_agent.core.stacks.dispatcher import JobDispatcher
from gpuhost_agent.core.stacks.status_reporter import StackRef, StatusReporter
from gpuhost_agent.protocol import wire, wire_jobs, wire_time
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.runtime.engine.records import ContainerSummary
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.client import MarketplaceClient
from gpuhost_agent.uplink.outbox import STATUS, Outbox
from gpuhost_agent.uplink.replies import MarketplaceRejected, MarketplaceUnavailable
from gpuhost_agent.uplink.session import SessionState

log = get_logger(__name__)
RESTART_SLACK = timedelta(seconds=30)


@dataclass(frozen=True, kw_only=True)
class ReconcileSources:
    """Where a run's picture comes from: what the marketplace wants (client,
    for the session's environment), what runs (engine), the agent's own record
    (db, the GPU ledger, which adopts GPUs found in use), and the reports still
    waiting in the outbox."""

    client: MarketplaceClient
    session: SessionState
    engine: DockerEngine
    db: AgentDB
    ledger: GpuLedger
    outbox: Outbox


@dataclass(frozen=True, kw_only=True)
class ReconcileTools:
    """What a run acts through: the dispatcher (the jobs it plans), the
    reporter (statuses), the rental clock's end dates (so that it wakes), and
    `keep_limits`, which writes the cgroup limits of the rentals whose
    containers a run sees (Sandbox.keep_limits; none: no limits kept)."""

    dispatcher: JobDispatcher
    reporter: StatusReporter
    end_dates: RentalEndDates
    keep_limits: Callable[[set[str]], Awaitable[None]] | None = None


class Reconciler:
    def __init__(self, *, sources: ReconcileSources, tools: ReconcileTools, grace_seconds: float):
        """What a run compares, what it acts through (two parts, by keyword),
        and how long a stack the marketplace does not list may stay."""
        self.client, self.session, self.engine = sources.client, sources.session, sources.engine
        self.db, self.ledger, self.outbox = sources.db, sources.ledger, sources.outbox
        self.dispatcher, self.reporter = tools.dispatcher, tools.reporter
        self.end_dates = tools.end_dates  # the rental clock's, so that it wakes
        self.keep_limits = tools.keep_limits
        self.grace_seconds = grace_seconds
        self._unlisted_since: dict[str, datetime] = {}
        self._skipped: tuple[str, ...] = ()  # the desired state's entries left out, as last said
        self._engine_outage: tuple[datetime, datetime] | None = None  # (last seen up, seen back)
        self.runs = 0
        self.last_actions: list[Action] = []
        # The marketplace's names of its stacks, as the last desired state gave
        # them: the agent's record keeps only the Compose project (a slug).
        self.stack_names: dict[str, str] = {}

    def stats(self) -> dict[str, object]:
        return {
            "runs": self.runs,
            "lastActions": [{"kind": a.kind, "target": a.target, "why": a.why} for a in self.last_actions],
        }

    def engine_restarted(self, last_up: datetime, back: datetime) -> None:
        """Containers the outage stopped are brought back by the next run."""
        self._engine_outage = (last_up - RESTART_SLACK, back + timedelta(seconds=5))

    async def run_once(self) -> list[Action]:
        env_id = self.session.env_id
        if not env_id:
            return []
        desired = await self._desired()
        if desired is not None and desired.env_id != env_id:
            log.error("desired_state_refused", error=f"it is for environment {desired.env_id}, not {env_id}")
            desired = None
        try:
            containers = await self.engine.environment_containers(env_id)
            seen = _seen_stacks(containers)
            await self._adopt(seen, containers, env_id)
            if self.keep_limits is not None:
                await self.keep_limits({stack.rental_id for stack in seen.values()})
            restore = await self._stopped_by_outage(desired, seen)
        except EngineError as exc:
            log.warning("reconcile_skipped", error=str(exc), reason="Docker Engine unavailable")
            return []
        if desired is not None:  # only this host's rentals: what it records, what it runs
            here = set(self.db.rentals()) | {row["rental_id"] for row in self.db.stacks().values()}
            here |= {stack.rental_id for stack in seen.values()}
            listed = {rental.rental_id: rental.end_date for rental in desired.rentals.values()}
            self.end_dates.note_many(dates_of_this_host(listed, here))
        picture = Picture(
            desired,
            seen,
            self.db.stacks(),
            self.db.rentals(),
            self.dispatcher.busy_stacks(),
            self.dispatcher.busy_rentals(),
            {stack_id for stack_id in (desired.stacks if desired else {}) if self.outbox.has(STATUS, stack_id)},
            restore,
        )
        actions = plan(picture, wire_time.utcnow(), self._unlisted_since, self.grace_seconds)
        for action in actions:
            self._carry_out(action, desired, seen, env_id)
        self.runs += 1
        self.last_actions = actions
        return actions

    async def _desired(self) -> DesiredState | None:
        try:
            desired = decode(await self.client.desired_state())
        except (MarketplaceUnavailable, MarketplaceRejected) as exc:
            log.info("reconcile_without_marketplace", error=str(exc))
        except wire_jobs.InvalidBody as exc:
            log.error("desired_state_refused", error=str(exc), hint="the marketplace sent a malformed desired state")
            return None
        else:
            if desired.problems and desired.problems != self._skipped:  # said once per change, not every run
                log.error(
                    "desired_state_entries_skipped",
                    count=len(desired.problems),
                    problems=list(desired.problems[:5]),
                    hint="the rest is reconciled; what these entries name is left as it is",
                )
            self._skipped = desired.problems
            named = (
                (stack.stack_id, stack.stack_name or (stack.template or {}).get("name"))
                for stack in desired.stacks.values()
            )
            self.stack_names = {stack_id: name for stack_id, name in named if name}
            return desired
        return None

    async def _adopt(self, seen: dict[str, SeenStack], containers: list[ContainerSummary], env_id: str) -> None:
        """After a fresh state file: take GPU assignments and stacks back from the labels."""
        records = self.db.stacks()
        for stack_id, stack in seen.items():
            rental = stack.rental_id
            if rental not in self.ledger.assignments and rental not in self.ledger.ended:
                members = [c for c in containers if (c.get("Labels") or {}).get(wire.LABEL_STACK) == stack_id]
                self.ledger.adopt(rental, await self._recorded_gpus(members))
            if stack_id not in records:
                status = wire.APPLIED if all(state == "running" for state in stack.states) else wire.APPLYING
                self.db.stack_status(stack_id, stack.rental_id, env_id, stack.project, status)

    async def _recorded_gpus(self, members: list[ContainerSummary]) -> list[str]:
        """The GPUs the agent itself wrote on a rental's containers. A
        container's labels are its image's with the agent's laid over them, so
        the rental's GPU label counts only where the image does not carry the
        same value (an image built with `LABEL io.gpuhost.rental-gpus=...`, on
        a container made before the agent set that label on every one). The
        GPUs each service was given (GPU_LABEL) the hardening has always set."""
        gpus: set[str] = set()
        for member in members:
            labels = member.get("Labels") or {}
            gpus.update(uuid for uuid in str(labels.get(GPU_LABEL) or "").split(",") if uuid)
            claimed = labels.get(wire.LABEL_GPUS)
            image = member.get("ImageID")  # absent on Swarm, whose task labels are the spec's alone
            if claimed and (not image or await self._image_lacks(image, wire.LABEL_GPUS, claimed)):
                gpus.update(naming.gpus_of(labels))
        return sorted(gpus)

    async def _image_lacks(self, image_id: str, key: str, value: str) -> bool:
        labels = await self.engine.image_labels(image_id)
        return labels is not None and labels.get(key) != value

    async def _stopped_by_outage(self, desired: DesiredState | None, seen: dict[str, SeenStack]) -> set[str]:
        if self._engine_outage is None or desired is None:
            return set()
        start, end = self._engine_outage
        self._engine_outage = None
        restore = set()
        for stack_id, stack in seen.items():
            wanted = desired.stacks.get(stack_id)
            if wanted is None or wanted.status != wire.APPLIED or "running" in stack.states:
                continue
            finished = [await self.engine.finished_at(cid) for cid in stack.container_ids]
            if finished and all(moment and start <= moment <= end for moment in finished):
                restore.add(stack_id)
        return restore

    def _carry_out(self, action: Action, desired: DesiredState | None, seen: dict[str, SeenStack], env_id: str) -> None:
        log.info(
            "reconcile_action",
            action=action.kind,
            stack_id=action.target if action.kind != END_RENTAL else None,
            rental_id=action.rental_id,
            why=action.why,
        )
        job_id = f"reconcile-{uuid.uuid4().hex[:12]}"
        wanted = desired.stacks.get(action.target) if desired else None
        rental = desired.rentals.get(action.rental_id) if desired else None
        name = wanted.stack_name if wanted else ""
        if action.kind == END_RENTAL:
            job = wire_jobs.StackJob(job_id, wire.JOB_RENTAL_END, "", action.rental_id, env_id, "", None)
        elif action.kind == DEPLOY:
            if wanted is None:
                return  # the plan deploys only stacks the desired state lists
            job = wire_jobs.StackJob(
                job_id,
                wire.JOB_DEPLOY,
                action.target,
                action.rental_id,
                env_id,
                name,
                wanted.template,
                rental.gpu_count if rental else 0,
            )
        else:
            seen_stack = seen.get(action.target)
            name = name or (naming.stack_name_of(seen_stack.project, action.target) if seen_stack else "")
            if action.kind == REPORT:
                stack = StackRef(action.target, action.rental_id, env_id, naming.project_name(name, action.target))
                self.reporter.status(stack, action.status, action.error_msg, job_id=job_id)
                return
            job = wire_jobs.StackJob(job_id, wire.JOB_REMOVE, action.target, action.rental_id, env_id, name, None)
        self.dispatcher.submit_internal(job)


def _seen_stacks(containers: list[ContainerSummary]) -> dict[str, SeenStack]:
    grouped: dict[str, list[ContainerSummary]] = {}
    for container in containers:
        labels = container.get("Labels") or {}
        if labels.get(wire.LABEL_MANAGED) == "true" and labels.get(wire.LABEL_STACK) and labels.get(wire.LABEL_RENTAL):
            grouped.setdefault(labels[wire.LABEL_STACK], []).append(container)
    seen = {}
    for stack_id, members in grouped.items():
        labels = members[0]["Labels"]
        gpus = sorted({uuid_ for member in members for uuid_ in naming.gpus_of(member["Labels"])})
        seen[stack_id] = SeenStack(
            labels[wire.LABEL_RENTAL],
            labels.get(COMPOSE_PROJECT_LABEL, ""),
            tuple(sorted(member.get("State", "") for member in members)),
            tuple(gpus),
            tuple(member["Id"] for member in members),
        )
    return seen

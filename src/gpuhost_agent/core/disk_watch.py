"""Each rental's share of Docker's disk, measured on a schedule.

A rental's containers write to their writable layers and to the stack's
volumes, all on Docker's disk; nothing in Docker limits either on the common
filesystems (a real quota needs overlay2 on XFS with project quotas, or the
btrfs driver: inventory/storage_quota.py). So the
agent measures: every `interval` it asks the engine what each container's
writable layer and each volume holds (`GET /system/df`, the numbers of
`docker system df -v`), adds them up per rental, and stops the running
containers of a rental above its share. Each of its stacks is then reported
ERROR with the figures and the limit, so the renter knows what to free.

The share is the host's setting when it gave one (GPUHOST_RENTAL_DISK),
else the rental's part of the usable disk (total less the host's floor) in
proportion to its GPUs, and a tenth of it for a rental without GPUs.

In a Swarm environment each machine has its own disk, so the leader judges
each machine apart: its own from its engine, every other from the figures
that machine's agent measures (`GET /gpuhost/disk`), each against the
rental's share of that machine (by the rental's GPUs there, a tenth without).
A rental above its share anywhere has its stacks scaled to no task, since
Swarm would start a new task for a container merely stopped.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.rentals.disk_share import disk_share
from gpuhost_agent.core.stacks.backend import StackBackend
from gpuhost_agent.core.stacks.status_reporter import StackRef, StatusReporter
from gpuhost_agent.inventory.machines import MachineDisk, Machines
from gpuhost_agent.protocol import wire
from gpuhost_agent.protocol.wire_system import SystemData
from gpuhost_agent.runtime.compose import STACK_NAMESPACE_LABEL as NAMESPACE_LABEL
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.runtime.engine.records import DiskUsage
from gpuhost_agent.storage.agent_db import AgentDB

log = get_logger(__name__)

GIB = 1024**3
PROJECT_LABEL = "com.docker.compose.project"
OTHER_MACHINE_SECONDS = 45.0  # how long the leader waits for another machine's figures (its door: 40 s)


def usage_by_rental(df: DiskUsage, project_rentals: Mapping[str, str]) -> dict[str, int]:
    """Bytes per rental: its containers' writable layers (by the agent's
    label) and its stacks' volumes (by Compose's project label, or on a Swarm
    the stack's namespace)."""
    used: dict[str, int] = {}
    for container in df.get("Containers") or []:
        rental = (container.get("Labels") or {}).get(wire.LABEL_RENTAL)
        if rental:
            used[rental] = used.get(rental, 0) + int(container.get("SizeRw") or 0)
    for volume in df.get("Volumes") or []:
        labels = volume.get("Labels") or {}
        rental = project_rentals.get(labels.get(PROJECT_LABEL) or labels.get(NAMESPACE_LABEL) or "")
        size = int(((volume.get("UsageData") or {}).get("Size")) or 0)
        if rental and size > 0:  # -1: not measured
            used[rental] = used.get(rental, 0) + size
    return used


def over_share_message(used: int, share: int, disk: str = "the host's disk") -> str:
    return (
        f"stopped: the rental's containers and volumes use {used / GIB:.2f} GiB of {disk}, above its "
        f"share of {share / GIB:.2f} GiB; remove data (or the stack, with its volumes) and deploy again"
    )


@dataclass(frozen=True, kw_only=True)
class DiskWatchParts:
    """What a pass asks and acts through: the engine (what each container and
    volume holds), the record and the GPU ledger (each rental's stacks and
    GPUs), the reporter (a stopped stack's ERROR), the machine's facts (its
    disk), the rentals a job is running for (not stopped in its midst),
    `machines`, which names the disks to judge and answers for the
    environment's other machines (none on one machine), and `stacks`, which
    stops a rental's stacks, as they run."""

    engine: DockerEngine
    db: AgentDB
    ledger: GpuLedger
    reporter: StatusReporter
    machine_facts: Callable[[], Awaitable[SystemData]]
    busy_rentals: Callable[[], set[str]]
    machines: Machines
    stacks: StackBackend


@dataclass(frozen=True, kw_only=True)
class DiskWatchSettings:
    """The host's settings: how often a pass runs, the disk floor, and a
    rental's fixed share (GPUHOST_RENTAL_DISK; None: by its GPUs)."""

    interval: float
    floor_bytes: int
    rental_disk_bytes: int | None


class DiskWatch:
    def __init__(self, *, parts: DiskWatchParts, settings: DiskWatchSettings):
        """Its collaborators, and the settings it measures by: two parts, by keyword."""
        self.engine, self.db, self.ledger, self.reporter = parts.engine, parts.db, parts.ledger, parts.reporter
        self.machine_facts, self.busy_rentals = parts.machine_facts, parts.busy_rentals
        self.interval, self.floor_bytes = settings.interval, settings.floor_bytes
        self.fixed = settings.rental_disk_bytes
        self.machines, self.stacks = parts.machines, parts.stacks
        self.last_usage: dict[str, int] = {}  # for `status` and tests: bytes per rental, all machines
        self.last_over: set[str] = set()  # rentals over their share at the last pass (metrics: an alert)

    async def run_once(self) -> None:
        machines = self.machines.disks(await self.machine_facts())
        figures = await self._figures(machines)
        projects = {row["project"]: row["rental_id"] for row in self.db.stacks().values()}
        busy = self.busy_rentals()
        totals: dict[str, int] = {}
        over: dict[str, tuple[int, int, str]] = {}
        for machine in machines:
            if machine.node not in figures:
                continue
            for rental_id, used in sorted(usage_by_rental(figures[machine.node], projects).items()):
                totals[rental_id] = totals.get(rental_id, 0) + used
                assigned = self.ledger.assignments.get(rental_id, [])
                here = len(assigned) if not machine.node else sum(1 for gpu in assigned if gpu in machine.gpus)
                share = disk_share(machine.total_bytes, self.floor_bytes, here, len(machine.gpus), self.fixed)
                if share and used > share and rental_id not in busy:
                    over.setdefault(rental_id, (used, share, machine.name))
        self.last_usage, self.last_over = totals, set(over)
        for rental_id, (used, share, disk) in sorted(over.items()):
            await self._stop(rental_id, used, share, disk)

    async def _figures(self, machines: list[MachineDisk]) -> dict[str, DiskUsage]:
        """Each machine's `GET /system/df` (or the part of it its agent sends), by node."""
        figures: dict[str, DiskUsage] = {}
        own = next((machine for machine in machines if machine.this), None)
        if own is not None:
            try:
                figures[own.node] = await self.engine.disk_usage()
            except EngineError as exc:
                log.warning("disk_usage_unavailable", error=str(exc))
        others = [machine.node for machine in machines if not machine.this]
        if others:
            for node, answer in (await self.machines.disk_figures(others, OTHER_MACHINE_SECONDS)).items():
                if "error" in answer:
                    log.warning("disk_usage_unavailable", node_id=node, error=str(answer["error"])[:300])
                else:
                    figures[node] = answer
        return figures

    async def _stop(self, rental_id: str, used: int, share: int, disk: str) -> None:
        running = [c for c in await self.engine.rental_containers(rental_id) if c.get("State") == "running"]
        if not running:
            return
        message = over_share_message(used, share, disk)
        log.warning("rental_over_disk_share", rental_id=rental_id, used_bytes=used, share_bytes=share, disk=disk)
        # Said first: the stops that follow are the agent's, not a crash for the container watch to report.
        stack_ids = {str((c.get("Labels") or {}).get(wire.LABEL_STACK) or "") for c in running} - {""}
        known = self.db.stacks()
        records = {stack_id: known.get(stack_id) for stack_id in sorted(stack_ids)}
        for stack_id, record in records.items():
            if record is not None:
                stack = StackRef(stack_id, rental_id, record["env_id"], record["project"])
                self.reporter.status(stack, wire.ERROR, message, job_id=f"disk-{uuid.uuid4().hex[:12]}")
        projects = sorted(record["project"] for record in records.values() if record is not None)
        await self.stacks.stop(projects, running)

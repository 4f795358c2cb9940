"""Each rental's share of Docker's disk, measured on a schedule.

A rental's containers write to their writable layers and to the stack's
volumes, all on Docker's disk; nothing in Docker limits either on the common
filesystems (a real quota needs overlay2 on XFS with project quotas). So the
agent measures: every `interval` it asks the engine what each container's
writable layer and each volume holds (`GET /system/df`, the numbers of
`docker system df -v`), adds them up per rental, and stops the running
containers of a rental above its share. Each of its stacks is then reported
ERROR with the figures and the limit, so the renter knows what to free.

The share is the host's setting when it gave one (GPUHOST_RENTAL_DISK),
else the rental's part of the usable disk (total less the host's floor) in
proportion to its GPUs, and a tenth of it for a rental without GPUs.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.gpu_ledger import GpuLedger
from gpuhost_agent.core.status_reporter import StackRef, StatusReporter
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.engine import DockerEngine, EngineError
from gpuhost_agent.storage.agent_db import AgentDB

log = get_logger(__name__)

GIB = 1024**3
GPU_LESS_FRACTION = 0.1
PROJECT_LABEL = "com.docker.compose.project"


def usage_by_rental(df: Mapping, project_rentals: Mapping[str, str]) -> dict[str, int]:
    """Bytes per rental: its containers' writable layers (by the agent's
    label) and its stacks' volumes (by Compose's project label)."""
    used: dict[str, int] = {}
    for container in df.get("Containers") or []:
        rental = (container.get("Labels") or {}).get(wire.LABEL_RENTAL)
        if rental:
            used[rental] = used.get(rental, 0) + int(container.get("SizeRw") or 0)
    for volume in df.get("Volumes") or []:
        rental = project_rentals.get((volume.get("Labels") or {}).get(PROJECT_LABEL) or "")
        size = int(((volume.get("UsageData") or {}).get("Size")) or 0)
        if rental and size > 0:  # -1: not measured
            used[rental] = used.get(rental, 0) + size
    return used


def disk_share(total: int, floor: int, rental_gpus: int, machine_gpus: int, fixed: int | None) -> int:
    """Bytes of Docker's disk one rental may use."""
    if fixed:
        return fixed
    usable = max(0, total - floor)
    if rental_gpus <= 0 or machine_gpus <= 0:
        return int(usable * GPU_LESS_FRACTION)
    return int(usable * min(1.0, rental_gpus / machine_gpus))


def over_share_message(used: int, share: int) -> str:
    return (
        f"stopped: the rental's containers and volumes use {used / GIB:.2f} GiB of the host's disk, above its "
        f"share of {share / GIB:.2f} GiB; remove data (or the stack, with its volumes) and deploy again"
    )


class DiskWatch:
    def __init__(
        self,
        engine: DockerEngine,
        db: AgentDB,
        ledger: GpuLedger,
        reporter: StatusReporter,
        machine_facts: Callable[[], Awaitable[dict]],
        busy_rentals: Callable[[], set[str]],
        *,
        interval: float = 60.0,
        floor_bytes: int = 0,
        rental_disk_bytes: int | None = None,
        stop_timeout: int = 10,
    ):
        self.engine, self.db, self.ledger, self.reporter = engine, db, ledger, reporter
        self.machine_facts, self.busy_rentals = machine_facts, busy_rentals
        self.interval, self.floor_bytes, self.fixed = interval, floor_bytes, rental_disk_bytes
        self.stop_timeout = stop_timeout
        self.last_usage: dict[str, int] = {}  # for `status` and tests

    async def run_once(self) -> None:
        try:
            df = await self.engine.disk_usage()
        except EngineError as exc:
            log.warning("disk_usage_unavailable", error=str(exc))
            return
        stacks = self.db.stacks()
        projects = {row["project"]: row["rental_id"] for row in stacks.values()}
        self.last_usage = usage_by_rental(df, projects)
        facts = await self.machine_facts()
        total = int((((facts.get("host") or {}).get("storage")) or {}).get("totalBytes") or 0)
        machine_gpus = len((facts.get("nvml") or {}).get("gpus") or [])
        busy = self.busy_rentals()
        for rental_id, used in sorted(self.last_usage.items()):
            gpus = len(self.ledger.assignments.get(rental_id, []))
            share = disk_share(total, self.floor_bytes, gpus, machine_gpus, self.fixed)
            if share and used > share and rental_id not in busy:
                await self._stop(rental_id, used, share)

    async def _stop(self, rental_id: str, used: int, share: int) -> None:
        running = [c for c in await self.engine.rental_containers(rental_id) if c.get("State") == "running"]
        if not running:
            return
        message = over_share_message(used, share)
        log.warning("rental_over_disk_share", rental_id=rental_id, used_bytes=used, share_bytes=share)
        # Said first: the stops that follow are the agent's, not a crash for the container watch to report.
        stack_ids = {str((c.get("Labels") or {}).get(wire.LABEL_STACK) or "") for c in running} - {""}
        records = self.db.stacks()
        for stack_id in sorted(stack_ids):
            record = records.get(stack_id)
            if record is not None:
                stack = StackRef(stack_id, rental_id, record["env_id"], record["project"])
                self.reporter.status(stack, wire.ERROR, message, job_id=f"disk-{uuid.uuid4().hex[:12]}")
        for container in running:
            await self.engine.stop_container(container["Id"], self.stop_timeout)

"""The machines of the environment the agent reports and watches: this one
alone, or every machine of a Swarm environment (core/swarm/machines.py).

The probe (inventory/system_data.py), the heartbeat (core/host_reporter.py),
the disk watch and the container watch ask the `Machines` they were given,
and never which kind it is: on one machine there is nothing beyond this
machine's own engine, so every answer is empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuhost_agent.protocol.wire_system import EnvironmentFacts, HostFacts, MachineFigures, SystemData
from gpuhost_agent.runtime.engine.records import ContainerSummary, DiskFigures


@dataclass(frozen=True)
class MachineDisk:
    """One machine's Docker disk, as the disk watch judges it."""

    node: str  # its Swarm node id; "" on a machine of its own
    name: str  # for the renter: "the host's disk", "gpu-2's disk"
    total_bytes: int  # 0: not known (its agent did not report): judged only against GPUHOST_RENTAL_DISK
    gpus: frozenset[str]  # its GPUs' UUIDs
    this: bool = True  # the agent's own machine, measured through its own engine


def this_machine_disks(facts: SystemData) -> list[MachineDisk]:
    """This machine's disk alone, with every GPU of its probe."""
    gpus = (facts.get("nvml") or {}).get("gpus") or []
    ids = frozenset(str(gpu.get("uuid") or f"#{index}") for index, gpu in enumerate(gpus))
    return [MachineDisk("", "the host's disk", storage_total(facts.get("host")), ids)]


def storage_total(host: object) -> int:
    """A `host` part's Docker disk size in bytes (0: not known)."""
    storage = (host.get("storage") if isinstance(host, dict) else None) or {}
    return int(storage.get("totalBytes") or 0)


class Machines(Protocol):
    async def environment(self, host: HostFacts) -> EnvironmentFacts | None:
        """systemData's `environment`: every machine, its GPUs and its own
        report (`host` is this machine's probe); None on one machine."""
        ...

    async def beat_figures(self, system_data: SystemData, timeout: float) -> dict[str, MachineFigures] | None:
        """A heartbeat's `machines`: each other machine's live GPU figures, or
        why none (`system_data` is the last report's); None on one machine."""
        ...

    async def disk_figures(self, nodes: list[str], timeout: float) -> dict[str, DiskFigures]:
        """Each of those other machines' use of its disk by the rentals, by node
        (`{"error": ...}` for one that did not answer)."""
        ...

    def disks(self, facts: SystemData) -> list[MachineDisk]:
        """The machines whose disks the disk watch judges (`facts` is this
        machine's probe, with the environment on a leader)."""
        ...

    def stack_error(self, containers: Sequence[ContainerSummary]) -> str:
        """Why a stack's containers cannot run: the machines they are on that
        are unwell ("" when none is)."""
        ...


class OneMachine:
    """This machine alone: no other machine to report, ask or watch."""

    async def environment(self, host: HostFacts) -> EnvironmentFacts | None:
        return None

    async def beat_figures(self, system_data: SystemData, timeout: float) -> dict[str, MachineFigures] | None:
        return None

    async def disk_figures(self, nodes: list[str], timeout: float) -> dict[str, DiskFigures]:
        return {}

    def disks(self, facts: SystemData) -> list[MachineDisk]:
        return this_machine_disks(facts)

    def stack_error(self, containers: Sequence[ContainerSummary]) -> str:
        return ""

"""The machines of the environment the agent reports and watches: this one
alone, or every machine of a Swarm environment (core/swarm/machines.py).

The probe (inventory/system_data.py), the heartbeat (core/host_reporter.py),
the disk watch and the container watch ask the `Machines` they were given,
and never which kind it is: on one machine there is nothing beyond this
machine's own engine, so every answer is empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpuhost_agent.protocol.wire_system import EnvironmentFacts, HostFacts, MachineFigures
from gpuhost_agent.runtime.engine.records import ContainerSummary, DiskFigures


class Machines(Protocol):
    async def environment(self, host: HostFacts) -> EnvironmentFacts | None:
        """systemData's `environment`: every machine, its GPUs and its own
        report (`host` is this machine's probe); None on one machine."""
        ...

    async def live_figures(self, nodes: list[str], timeout: float) -> dict[str, MachineFigures]:
        """A heartbeat's `machines`: each of those other machines' live GPU figures, or why none."""
        ...

    async def disk_figures(self, nodes: list[str], timeout: float) -> dict[str, DiskFigures]:
        """Each of those other machines' use of its disk by the rentals, by node
        (`{"error": ...}` for one that did not answer)."""
        ...

    def stack_error(self, containers: Sequence[ContainerSummary]) -> str:
        """Why a stack's containers cannot run: the machines they are on that
        are unwell ("" when none is)."""
        ...


class OneMachine:
    """This machine alone: no other machine to report, ask or watch."""

    async def environment(self, host: HostFacts) -> EnvironmentFacts | None:
        return None

    async def live_figures(self, nodes: list[str], timeout: float) -> dict[str, MachineFigures]:
        return {}

    async def disk_figures(self, nodes: list[str], timeout: float) -> dict[str, DiskFigures]:
        return {}

    def stack_error(self, containers: Sequence[ContainerSummary]) -> str:
        return ""

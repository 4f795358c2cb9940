"""The machines of a Swarm environment, as its leader sees them
(inventory/machines.py): the nodes from the manager, each machine's own
report, live GPU figures and disk figures from its agent (through its door,
runtime/swarm_streams.py), and which machines are unwell (the watch's last
look, core/swarm/watch.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from gpuhost_agent.core.swarm.watch import SwarmMachines
from gpuhost_agent.inventory import swarm_nodes
from gpuhost_agent.inventory.environment import environment_disks, other_nodes
from gpuhost_agent.inventory.machines import MachineDisk
from gpuhost_agent.protocol.wire_system import EnvironmentFacts, HostFacts, MachineAnswer, MachineFigures, SystemData
from gpuhost_agent.runtime.engine.client import DockerEngine
from gpuhost_agent.runtime.engine.records import ContainerSummary, DiskFigures

MACHINE_PROBE_SECONDS = 60.0  # another machine's first report may start a GPU container there
# The leader's question to the other machines' agents: their reports by node id, waiting at
# most the seconds given; True: the live figures alone (runtime/swarm_streams.py).
Reports = Callable[[list[str], float, bool], Awaitable[dict[str, MachineAnswer]]]
Disks = Callable[[list[str], float], Awaitable[dict[str, DiskFigures]]]


async def no_reports(nodes: list[str], timeout: float, live: bool) -> dict[str, MachineAnswer]:
    """No agent asked (the `probe` command): the other machines' reports are left out."""
    return {}


async def no_disks(nodes: list[str], timeout: float) -> dict[str, DiskFigures]:
    return {}


class SwarmEnvironment:
    def __init__(self, engine: DockerEngine, reports: Reports, disks: Disks, health: SwarmMachines):
        self.engine, self.reports, self.ask_disks, self.health = engine, reports, disks, health

    async def environment(self, host: HostFacts) -> EnvironmentFacts | None:
        environment = await swarm_nodes.environment_facts(self.engine)
        own = ((host.get("docker") or {}).get("swarm") or {}).get("nodeId")
        others = [node["nodeId"] for node in environment["nodes"] if node["nodeId"] != own]
        reports = await self.reports(others, MACHINE_PROBE_SECONDS, False) if others else {}
        swarm_nodes.attach_machines(environment, own, reports)
        return environment

    async def beat_figures(self, system_data: SystemData, timeout: float) -> dict[str, MachineFigures] | None:
        others = other_nodes(system_data)
        if not others:  # no other machine reported yet: the heartbeat names none
            return None
        return swarm_nodes.live_figures(await self.reports(others, timeout, True))

    async def disk_figures(self, nodes: list[str], timeout: float) -> dict[str, DiskFigures]:
        return await self.ask_disks(nodes, timeout)

    def disks(self, facts: SystemData) -> list[MachineDisk]:
        return environment_disks(facts)

    def stack_error(self, containers: Sequence[ContainerSummary]) -> str:
        return self.health.stack_error(containers)

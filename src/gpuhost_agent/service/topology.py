"""The one decision between one machine and a Swarm environment's leader
(docs/design.md, "One machine or many").

`for_config` reads the mode once; `one_machine` and `swarm_leader` build
the parts that differ, and the composition root (service/wiring.py) hands
them on like any other collaborator. Nothing below `service/` asks which
mode it runs in: it is given the engine, the stack backend, the rental
shares, the placement and the environment's machines that fit
(tests/unit/test_topology_boundary.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from gpuhost_agent.core.agent import PeriodicWatch
from gpuhost_agent.core.containers.watch import ContainerWatch
from gpuhost_agent.core.rentals.shares import CgroupShares, NoRentalCgroups, RentalShares
from gpuhost_agent.core.sandbox.placement import OneMachinePlacement, Placement
from gpuhost_agent.core.stacks.backend import StackBackend
from gpuhost_agent.core.stacks.compose_backend import ComposeBackend
from gpuhost_agent.core.swarm.backend import SwarmBackend
from gpuhost_agent.core.swarm.machines import SwarmEnvironment, no_disks, no_reports
from gpuhost_agent.core.swarm.placement import SwarmPlacer
from gpuhost_agent.core.swarm.watch import SwarmMachines, SwarmWatch
from gpuhost_agent.core.swarm.worker_events import WorkerEvents
from gpuhost_agent.inventory.machines import Machines, OneMachine
from gpuhost_agent.runtime.compose import ComposeRunner
from gpuhost_agent.runtime.engine.client import DockerEngine
from gpuhost_agent.runtime.engine.records import ContainerSummary
from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.runtime.rental_cgroups import RentalCgroups
from gpuhost_agent.runtime.swarm_engine import SwarmEngine
from gpuhost_agent.runtime.swarm_stacks import SwarmStacks
from gpuhost_agent.runtime.swarm_streams import SwarmStreams
from gpuhost_agent.service.config import AgentConfig, SwarmRole

ListStack = Callable[[str], Awaitable[list[ContainerSummary]]]


class Topology:
    """The parts that differ between one machine and a Swarm leader."""

    stream_engine: EngineStreams  # logs, terminals, files (a leader's reach other machines through their agents)
    engine: DockerEngine  # a leader's lists containers from the manager's tasks, on every machine
    shares: RentalShares  # the rentals' cgroups (one machine), or none
    placement: Placement  # where a stack's services run
    machines: Machines  # the environment's machines
    list_stack: ListStack  # a stack's containers for SSH, wherever they run
    pulls_here = True  # renters' images are pulled by this machine's engine (a Swarm's: by each machine's)

    def stack_backend(self, compose: ComposeRunner, stop_timeout: int) -> StackBackend:
        raise NotImplementedError

    def watches(
        self, container_watch: ContainerWatch, env_id: Callable[[], str | None], changed: Callable[[], Awaitable[None]]
    ) -> list[PeriodicWatch]:
        """What the agent polls for the environment beyond this machine."""
        raise NotImplementedError


class OneMachineTopology(Topology):
    def __init__(self) -> None:
        self.stream_engine, self.engine = EngineStreams(), DockerEngine()
        self.shares = CgroupShares(RentalCgroups())
        self.placement, self.machines = OneMachinePlacement(), OneMachine()
        self.list_stack = self.stream_engine.stack_containers  # this machine's engine holds them all

    def stack_backend(self, compose: ComposeRunner, stop_timeout: int) -> StackBackend:
        return ComposeBackend(compose, self.engine, self.shares.memory_limit_reached, stop_timeout=stop_timeout)

    def watches(
        self, container_watch: ContainerWatch, env_id: Callable[[], str | None], changed: Callable[[], Awaitable[None]]
    ) -> list[PeriodicWatch]:
        return []  # the engine's own events cover this machine


class SwarmLeaderTopology(Topology):
    """Stacks go to every machine (docs/swarm.md)."""

    pulls_here = False

    def __init__(self, config: AgentConfig, docker_config_dir: Path) -> None:
        # Imported here: `cryptography` (its own OpenSSL) is about 8 MB of resting
        # memory that an agent alone on its machine never uses.
        from gpuhost_agent.service import swarm_tls

        tls = swarm_tls.context_or_exit("leader", config.swarm_tls_dir) if config.swarm_key else None
        self.door = SwarmStreams(
            key=config.swarm_key,
            workers=config.swarm_workers,
            worker_port=config.swarm_listen[1],
            tls=tls,
            crl=swarm_tls.crl_header(config.swarm_tls_dir) if tls else None,
        )
        self.stream_engine = self.door
        self.engine = engine = SwarmEngine(elsewhere=self.door.inspect)
        self.swarm_stacks = SwarmStacks(engine, docker_config_dir=docker_config_dir)
        self.shares = NoRentalCgroups()  # Swarm has no cgroup_parent: the rewrite divides the share
        self.placement = SwarmPlacer(
            engine.rental_peers, encrypted=config.swarm_encrypted, disk_floor_bytes=config.disk_floor_bytes
        )
        self.health = SwarmMachines()  # the other machines' health, as the leader last saw it
        self.machines = SwarmEnvironment(engine, self.door.machine_reports, self.door.disk_figures, self.health)
        self.list_stack = engine.stack_containers  # containers on every machine

    def stack_backend(self, compose: ComposeRunner, stop_timeout: int) -> StackBackend:
        return SwarmBackend(compose, self.engine, self.swarm_stacks)

    def watches(
        self, container_watch: ContainerWatch, env_id: Callable[[], str | None], changed: Callable[[], Awaitable[None]]
    ) -> list[PeriodicWatch]:
        events = WorkerEvents(self.door.follow_events, container_watch.other_machine_event)
        watch = SwarmWatch(
            self.engine,
            container_watch,
            self.health,
            env_id,
            changed,
            self.swarm_stacks.restart_service,
            worker_events=events,
        )
        return [watch]


def for_config(config: AgentConfig, docker_config_dir: Path) -> Topology:
    """The agent's topology, from the one setting that names it."""
    if config.swarm is SwarmRole.LEADER:
        return SwarmLeaderTopology(config, docker_config_dir)
    return OneMachineTopology()


def probe_machines(config: AgentConfig, engine: DockerEngine) -> Machines:
    """The machines the `probe` command reports: a leader's environment
    without its other machines' own reports (no agent is asked)."""
    if config.swarm is SwarmRole.LEADER:
        return SwarmEnvironment(engine, no_reports, no_disks, SwarmMachines())
    return OneMachine()


def doctor_checks(config: AgentConfig) -> list[dict]:
    """What doctor adds on a machine of a Swarm environment: its door certificate's
    end, a month ahead (service/swarm_tls.py); nothing on one machine."""
    if not config.swarm:
        return []
    from gpuhost_agent.service import swarm_tls  # cryptography's x509: loaded on a Swarm machine alone

    return [swarm_tls.doctor_check(config.swarm.value, config.swarm_tls_dir)]

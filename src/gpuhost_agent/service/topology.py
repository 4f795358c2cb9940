"""The one decision between one machine and a Swarm environment's leader
(docs/design.md, "One machine or many").

`for_config` reads the mode once; `one_machine` and `swarm_leader` build
the parts that differ, and the composition root (service/wiring.py) hands
them on like any other collaborator. Nothing below `service/` asks which
mode it runs in: it is given the engine, the stack backend and the
environment's machines that fit (tests/unit/test_topology_boundary.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuhost_agent.core.compose_backend import ComposeBackend
from gpuhost_agent.core.deploy_failures import LimitReached
from gpuhost_agent.core.stack_backend import StackBackend
from gpuhost_agent.core.swarm.backend import SwarmBackend
from gpuhost_agent.runtime.compose import ComposeRunner
from gpuhost_agent.runtime.engine import DockerEngine
from gpuhost_agent.runtime.engine_streams import EngineStreams
from gpuhost_agent.runtime.rental_cgroups import RentalCgroups
from gpuhost_agent.runtime.swarm_engine import SwarmEngine
from gpuhost_agent.runtime.swarm_stacks import SwarmStacks
from gpuhost_agent.runtime.swarm_streams import SwarmStreams
from gpuhost_agent.service import swarm_tls
from gpuhost_agent.service.config import AgentConfig


@dataclass
class Topology:
    """The parts that differ between one machine and a Swarm leader."""

    stream_engine: EngineStreams  # logs, terminals, files: a leader's reach other machines through their agents
    engine: DockerEngine  # a leader's lists containers from the manager's tasks, on every machine
    swarm: SwarmStreams | None = None  # a leader's door to the other machines' agents
    swarm_stacks: SwarmStacks | None = None  # a leader's `docker stack` and `docker service`
    cgroups: RentalCgroups | None = None  # one machine's rental cgroups (Swarm has no cgroup_parent)

    def stack_backend(
        self, compose: ComposeRunner, limit_reached: LimitReached | None, stop_timeout: int
    ) -> StackBackend:
        if self.swarm_stacks is not None:
            return SwarmBackend(compose, self.engine, self.swarm_stacks)
        return ComposeBackend(compose, self.engine, limit_reached, stop_timeout=stop_timeout)


def for_config(config: AgentConfig, docker_config_dir: Path) -> Topology:
    """The agent's topology, from the one setting that names it."""
    if config.swarm == "leader":  # a Swarm environment's leader: stacks go to every machine (docs/swarm.md)
        return swarm_leader(config, docker_config_dir)
    return one_machine()


def one_machine() -> Topology:
    return Topology(EngineStreams(), DockerEngine(), cgroups=RentalCgroups())


def swarm_leader(config: AgentConfig, docker_config_dir: Path) -> Topology:
    tls = swarm_tls.context_or_exit("leader", config.swarm_tls_dir) if config.swarm_key else None
    streams = SwarmStreams(
        key=config.swarm_key, workers=config.swarm_workers, worker_port=config.swarm_listen[1], tls=tls
    )
    engine = SwarmEngine(elsewhere=streams.inspect)
    return Topology(
        streams, engine, swarm=streams, swarm_stacks=SwarmStacks(engine, docker_config_dir=docker_config_dir)
    )

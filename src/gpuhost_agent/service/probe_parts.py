"""What `gpuhost-agent probe` and `doctor` build: the daemon's own probe, made
the same way as the running agent's (service/wiring.py uses build_prober), so
the two never judge a host differently."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from gpuhost_agent.inventory import driver_cdi
from gpuhost_agent.inventory.machines import Machines
from gpuhost_agent.inventory.nvml_probe import NvmlProbe
from gpuhost_agent.inventory.system_data import Prober
from gpuhost_agent.runtime.engine.client import DockerEngine
from gpuhost_agent.service.config import AgentConfig
from gpuhost_agent.service.topology import probe_machines
from gpuhost_agent.streams import pull_guard


@dataclass
class ProbeParts:
    """What `gpuhost-agent probe` and `doctor` run: the daemon's own probe."""

    engine: DockerEngine
    nvml: NvmlProbe
    prober: Prober

    async def close(self) -> None:
        await self.engine.close()
        self.nvml.close()


def guard_key_file(config: AgentConfig) -> Path:
    """Where the pull guard's key for this start lies (root's alone, in the state directory)."""
    return config.state_dir / "pull-guard.key"


def build_probe(config: AgentConfig, compose_command: list[str] | None) -> ProbeParts:
    engine, nvml = DockerEngine(timeout=10), NvmlProbe(config.nvml_library)
    machines = probe_machines(config, engine)
    # The agent's CDI spec looked at, never written: that is the running agent's (driver_cdi.keep).
    looked = partial(driver_cdi.look, driver_root=config.driver_root)
    return ProbeParts(engine, nvml, build_prober(config, engine, nvml, compose_command, machines, cdi=looked))


def build_prober(
    config: AgentConfig,
    engine: DockerEngine,
    nvml: NvmlProbe,
    compose_command: list[str] | None,
    machines: Machines,
    cdi: Callable[[dict, dict], dict] | None = None,
) -> Prober:
    """`machines`: the environment's machines (service/topology.py), whose
    reports the probe includes."""
    return Prober(
        nvml,
        engine,
        compose_command,
        gpu_check_image=config.gpu_check_image,
        toolkit_config=config.toolkit_config,
        location=config.location,
        machines=machines,
        egress_allow=config.egress_allow,
        egress_openings=config.engine_openings,
        pull_guard=config.pull_guard,
        guard_answers=partial(pull_guard.answers, key_file=guard_key_file(config)),
        cdi=cdi,
    )

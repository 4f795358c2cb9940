"""What `gpuhost-agent probe` and `doctor` build: the daemon's own probe, made
the same way as the running agent's (service/wiring.py uses build_prober), so
the two never judge a host differently."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpuhost_agent.inventory.nvml_probe import NvmlProbe
from gpuhost_agent.inventory.system_data import Prober
from gpuhost_agent.runtime.engine import DockerEngine
from gpuhost_agent.service.config import AgentConfig


@dataclass
class ProbeParts:
    """What `gpuhost-agent probe` and `doctor` run: the daemon's own probe."""

    engine: DockerEngine
    nvml: NvmlProbe
    prober: Prober

    def close(self) -> None:
        self.engine.close()
        self.nvml.close()


def build_probe(config: AgentConfig, compose_command: list[str] | None) -> ProbeParts:
    engine, nvml = DockerEngine(timeout=10), NvmlProbe(config.nvml_library)
    return ProbeParts(engine, nvml, build_prober(config, engine, nvml, compose_command))


def build_prober(
    config: AgentConfig,
    engine: DockerEngine,
    nvml: NvmlProbe,
    compose_command: list[str] | None,
    machines: Callable[[list[str], float, bool], Awaitable[dict[str, dict]]] | None = None,
) -> Prober:
    """`machines`: a Swarm leader's question to the other machines' agents
    (runtime/swarm_streams.py); without it their reports are left out."""
    return Prober(
        nvml,
        engine,
        compose_command,
        gpu_check_image=config.gpu_check_image,
        toolkit_config=config.toolkit_config,
        location=config.location,
        swarm_leader=config.swarm == "leader",
        machines=machines,
    )

"""The stack backend of a Swarm environment's leader: `docker stack`
(core/stacks/backend.py).

The same deploy as on one machine (core/stacks/deployer.py): the renter's file is
read by Compose (`config`), judged and hardened by the same sandbox, given
the rental's GPUs from the environment's ledger, and written for Swarm
(core/swarm/stack_file.py, inside the sandbox); this backend hands it to
`docker stack deploy` (runtime/swarm_stacks.py), as Portainer does for
Swarm environments. A stack counts as started once every task of it runs on
its machine; one that fails, or is still not running after `start_seconds`,
is taken down again with `docker stack rm`. Removal and a rental's end take
stacks down the same way, on every machine.

The containers, for the reports and the checks, come from the manager's
tasks (runtime/swarm_engine.py): one list whichever machine runs them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.compose_values import ComposeModel
from gpuhost_agent.core.sandbox.apply import refuse_with_compose_error
from gpuhost_agent.core.sandbox.raw import RawReview
from gpuhost_agent.core.stack_errors import StackFailed
from gpuhost_agent.core.stacks.backend import ListContainers
from gpuhost_agent.core.stacks.container_list import SERVICE_LABEL, failed_containers
from gpuhost_agent.runtime.compose import ComposeError, ComposeRunner
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.runtime.engine.records import ContainerSummary
from gpuhost_agent.runtime.swarm_stacks import NAMESPACE_LABEL, SwarmStacks

log = get_logger(__name__)

START_SECONDS = 120.0  # every task running within this, or the deploy fails (images are local: no pull)


@dataclass
class SwarmStart:
    """Nothing waits: `docker stack deploy` starts once the file is written."""

    model: ComposeModel
    foreign_names: frozenset[str]
    project: str
    swarm: SwarmStacks

    async def run(self, stack_id: str, text: str, stack: ComposeModel) -> None:
        await self.swarm.deploy(self.project, text)  # EngineError with the CLI's words

    async def discard(self) -> None:
        """Nothing was started before `run`."""


class SwarmBackend:
    def __init__(
        self, compose: ComposeRunner, engine: DockerEngine, swarm: SwarmStacks, *, start_seconds: float = START_SECONDS
    ):
        """`engine` lists containers from the manager's tasks (runtime/swarm_engine.py)."""
        self.compose, self.engine, self.swarm = compose, engine, swarm
        self.start_seconds = start_seconds

    async def prepare(self, project: str, original: Path, variables: dict[str, str], raw: RawReview) -> SwarmStart:
        try:
            model, raw.compose_warnings = await self.compose.config_and_warnings(
                project, original.parent, original.name, variables
            )
        except ComposeError as exc:
            raise refuse_with_compose_error(raw, str(exc)) from None
        return SwarmStart(model, await self.engine.foreign_names(project), project, self.swarm)

    def stack_file(self, labelled: ComposeModel) -> ComposeModel:
        return with_service_labels(labelled)

    async def until_running(self, stack_id: str) -> list[ContainerSummary]:
        """Every task of the stack running on its machine, or StackFailed
        naming the first that failed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_seconds
        while True:
            containers = await self.engine.stack_containers(stack_id)
            for container in failed_containers(containers):
                where = (container.get("Labels") or {}).get(SERVICE_LABEL, "?")
                said = container.get("Error") or container.get("Status") or container.get("State")
                raise StackFailed(f"service {where!r} did not start on its machine: {said}")
            if containers and all(c.get("State") == "running" for c in containers):
                return containers
            if loop.time() > deadline:
                raise StackFailed(f"the stack's services were not all running {self.start_seconds:.0f} s after deploy")
            await asyncio.sleep(0.25)

    async def take_down_failed(self, project: str, workdir: Path, stack_id: str) -> None:
        await self.swarm.remove(project)

    async def take_down(self, list_containers: ListContainers, workdir: Path, fallback: set[str]) -> set[str]:
        """`docker stack rm` of every stack the listed containers belong to (or
        the fallback ones when none is left)."""
        existing = await list_containers()
        projects = {p for c in existing if c.get("Labels") and (p := c["Labels"].get(NAMESPACE_LABEL)) is not None}
        projects = projects or fallback
        for project in sorted(projects):
            await self.swarm.remove(project)
        return projects

    async def stop(self, projects: list[str], running: list[ContainerSummary]) -> None:
        """Each stack's services scaled to no task (runtime/swarm_stacks.py):
        Swarm would start a new task for a container merely stopped."""
        for project in projects:
            try:
                await self.swarm.stop(project)
            except EngineError as exc:
                log.warning("rental_over_disk_share_stop_failed", project=project, error=str(exc))


def with_service_labels(stack: ComposeModel) -> ComposeModel:
    """The agent's labels on each service too (not only its containers): the
    manager filters services and tasks by those."""
    for service in (stack.get("services") or {}).values():
        deploy = service.setdefault("deploy", {})
        deploy["labels"] = {**(deploy.get("labels") or {}), **(service.get("labels") or {})}
    return stack

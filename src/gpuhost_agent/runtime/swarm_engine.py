"""The engine as a Swarm environment's leader sees it: containers on every
machine.

On one machine the agent lists a stack's, a rental's or the environment's
containers with the engine's container list, filtered by the agent's labels.
On a Swarm manager that list holds only the manager's own containers, so the
leader answers the same three questions from the manager's tasks, which
cover every machine (runtime/swarm_tasks.py). Everything else (events, inspect,
the engine's facts) is still this machine's engine. The reconciler, the
container watch and the deployer use it as they use the engine, so a stack
whose containers run elsewhere is seen running, not missing.

A stopped container's state (its exit code, and whether the kernel's OOM
killer did it, which no task tells) is its machine's: one this engine does
not know is asked of `elsewhere`, the inspect that goes to the container's
machine's agent (runtime/swarm_streams.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import cast

from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.runtime.engine.records import ContainerState, ContainerSummary
from gpuhost_agent.runtime.swarm_stacks import NAMESPACE_LABEL
from gpuhost_agent.runtime.swarm_tasks import NODE_LABEL, stack_containers


class SwarmEngine(DockerEngine):
    def __init__(self, *, timeout: float = 30, elsewhere: Callable[[str], Awaitable[dict]] | None = None):
        super().__init__(timeout=timeout)
        self.elsewhere = elsewhere

    async def container_state(self, container_id: str) -> ContainerState:
        try:
            return await super().container_state(container_id)
        except EngineError:
            if self.elsewhere is None:
                raise
        return cast(ContainerState, (await self.elsewhere(container_id)).get("State") or {})

    async def _containers(self, labels: list[str]) -> list[ContainerSummary]:
        tasks = await self.swarm_list("tasks", labels)
        if not tasks:
            return []
        return stack_containers(await self.swarm_list("services"), tasks)

    async def stack_containers(self, stack_id: str) -> list[ContainerSummary]:
        return await self._containers([f"{wire.LABEL_STACK}={stack_id}"])

    async def environment_containers(self, env_id: str) -> list[ContainerSummary]:
        return await self._containers([f"{wire.LABEL_MANAGED}=true", f"{wire.LABEL_ENV}={env_id}"])

    async def rental_containers(self, rental_id: str) -> list[ContainerSummary]:
        return await self._containers([f"{wire.LABEL_MANAGED}=true", f"{wire.LABEL_RENTAL}={rental_id}"])

    async def rental_peers(self, rental_id: str, project: str) -> dict[str, int]:
        """The rental's running or starting containers per machine, but those
        of `project` (the stack being deployed, which replaces its own)."""
        peers: dict[str, int] = {}
        for container in await self.rental_containers(rental_id):
            labels = container.get("Labels") or {}
            if labels.get(NAMESPACE_LABEL) != project and container.get("State") in ("running", "created"):
                node = labels.get(NODE_LABEL, "")
                peers[node] = peers.get(node, 0) + 1
        return peers

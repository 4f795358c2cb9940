"""The stack backend of one machine: Docker Compose (core/stacks/backend.py).

A stack starts with `compose up`, already started while the sandbox judges
the file (core/stacks/deploy_start.py), and counts as started when Compose says so;
a failed one, a removed one and a rental's leftovers go with `compose down`
of their project, and whatever is still listed after is force-removed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from gpuhost_agent.core.compose_values import ComposeModel
from gpuhost_agent.core.sandbox.raw import RawReview
from gpuhost_agent.core.stack_errors import StackFailed
from gpuhost_agent.core.stacks.backend import ListContainers
from gpuhost_agent.core.stacks.deploy_failures import LimitReached, describe_up_failure
from gpuhost_agent.core.stacks.deploy_start import start_compose
from gpuhost_agent.core.stacks.image_checks import started_problem
from gpuhost_agent.runtime.compose import COMPOSE_PROJECT_LABEL, ComposeError, ComposeRunner, PendingUp
from gpuhost_agent.runtime.engine.client import DockerEngine
from gpuhost_agent.runtime.engine.records import ContainerSummary


@dataclass
class ComposeStart:
    """`compose up` waiting for the hardened file (runtime/compose.py, PendingUp)."""

    model: ComposeModel
    foreign_names: frozenset[str]
    up: PendingUp
    backend: ComposeBackend

    async def run(self, stack_id: str, text: str, stack: ComposeModel) -> None:
        try:
            await self.up.run(text)
        except ComposeError as exc:
            backend = self.backend
            failure = await describe_up_failure(backend.engine, stack_id, stack, str(exc), backend.rental_limit_reached)
            raise StackFailed(failure) from None

    async def discard(self) -> None:
        await self.up.discard()


class ComposeBackend:
    def __init__(
        self,
        compose: ComposeRunner,
        engine: DockerEngine,
        rental_limit_reached: LimitReached | None,
        *,
        stop_timeout: int,
    ):
        """`rental_limit_reached` tells a container OOM-killed at the rental's
        shared limit from one killed at its own, for a failed start's errorMsg."""
        self.compose, self.engine = compose, engine
        self.rental_limit_reached, self.stop_timeout = rental_limit_reached, stop_timeout

    async def prepare(self, project: str, original: Path, variables: dict[str, str], raw: RawReview) -> ComposeStart:
        model, foreign_names, up = await start_compose(self.compose, self.engine, project, original, variables, raw)
        return ComposeStart(model, foreign_names, up, self)

    def stack_file(self, labelled: ComposeModel) -> ComposeModel:
        """The hardened model as Compose reads it, every image as the agent
        pulled and judged it: Compose pulls none itself (a `pull_policy:
        always` image pulled at `up` was never judged before its start, and a
        tag pulled again could differ; core/stacks/image_checks.py)."""
        services = {
            name: {**service, "pull_policy": "never"} if isinstance(service, dict) and "image" in service else service
            for name, service in (labelled.get("services") or {}).items()
        }
        return {**labelled, "services": services}

    async def until_running(self, stack_id: str) -> list[ContainerSummary]:
        """The stack's containers (`up --detach` returned: they were started),
        each one's configuration judged as the engine merged its image's in."""
        containers = await self.engine.stack_containers(stack_id)
        if problem := await started_problem(self.engine, containers):
            raise StackFailed(f"deploy failed: {problem}")
        return containers

    async def take_down_failed(self, project: str, workdir: Path, stack_id: str) -> None:
        await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True, mode=0o700)
        await self.compose.down(project, workdir, stop_timeout=0)
        for leftover in await self.engine.stack_containers(stack_id):
            await self.engine.remove_container(leftover["Id"])

    async def take_down(self, list_containers: ListContainers, workdir: Path, fallback: set[str]) -> set[str]:
        """`compose down` every project the listed containers belong to (or the
        fallback projects when none is left), then force-remove whatever is
        still listed."""
        existing = await list_containers()
        projects = {
            p for c in existing if c.get("Labels") and (p := c["Labels"].get(COMPOSE_PROJECT_LABEL)) is not None
        }
        projects = projects or fallback
        await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True, mode=0o700)
        for project in sorted(projects):
            await self.compose.down(project, workdir, stop_timeout=self.stop_timeout)
        for leftover in await list_containers():
            await self.engine.remove_container(leftover["Id"])
        return projects

    async def stop(self, projects: list[str], running: list[ContainerSummary]) -> None:
        for container in running:  # a stopped container stays stopped: the restart policy does not apply
            await self.engine.stop_container(container["Id"], self.stop_timeout)

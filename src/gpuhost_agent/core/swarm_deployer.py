"""Deploy and remove stacks on a Swarm environment, from its leader.

The same steps and reports as on one machine (core/deployer.py): the
renter's file is read by Compose (`config`), judged and hardened by the same
sandbox, given the rental's GPUs from the environment's ledger, and only
then written for Swarm (core/swarm_rewrite.py, inside the sandbox) and
handed to `docker stack deploy` (runtime/swarm_stacks.py), as Portainer does
for Swarm environments. A stack is APPLIED once every task of it runs on its
machine; one that fails, or is still not running after the settle time, is
taken down again with `docker stack rm` and reported ERROR with the reason.
Removal and a rental's end take stacks down the same way, on every machine.

The containers, for the reports and the checks, come from the manager's
tasks (core/swarm_engine.py): one list whichever machine runs them.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gpuhost_agent.common import faults
from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.compose_rewrite import StackRejected, label_services
from gpuhost_agent.core.containers import SERVICE_LABEL, failed_containers
from gpuhost_agent.core.deploy_start import StackFailed
from gpuhost_agent.core.deployer import AGENT_FILE, ORIGINAL_FILE, StackDeployer, _write_private
from gpuhost_agent.core.sandbox import notices_message, refuse_with_compose_error
from gpuhost_agent.core.sandbox_context import SandboxContext
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.compose import ComposeError
from gpuhost_agent.runtime.engine import EngineError
from gpuhost_agent.runtime.swarm_stacks import NAMESPACE_LABEL, SwarmStacks

log = get_logger(__name__)

START_SECONDS = 120.0  # every task running within this, or the deploy fails (images are local: no pull)


class SwarmDeployer(StackDeployer):
    def __init__(self, *args: Any, swarm: SwarmStacks, start_seconds: float = START_SECONDS, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.swarm = swarm
        self.start_seconds = start_seconds

    async def deploy(self, job: wire.StackJob) -> str:
        template, variables, project, workdir = self._begin(job)
        try:
            raw = await self._renter_file(job, template, variables, workdir)
            try:
                model = await self.compose.config(project, workdir, ORIGINAL_FILE, variables)
            except ComposeError as exc:
                raise refuse_with_compose_error(raw, str(exc)) from None
            places = SandboxContext(
                project=project,
                project_dir=str(await asyncio.to_thread(workdir.resolve)),
                home_dir=str(self.compose.home_dir),
                agent_dir=str(self.stacks_dir.parent),
                foreign_names=await self.engine.foreign_names(project),
            )
            stack, gpus, notices = await self.sandbox.apply(
                job, model, raw, places, waiting=lambda reason: self._report(job, wire.APPLYING, reason)
            )
            labelled = with_service_labels(
                label_services(
                    stack, job.stack_id, job.rental_id, job.env_id, gpus, ssh=template.get("isSSHEnabled") is True
                )
            )
            text = json.dumps(labelled, indent=1)
            await asyncio.to_thread(_write_private, workdir / AGENT_FILE, text)
            faults.crash_point("deploy.before_compose_up")
            await self.swarm.deploy(project, text)
            await self._until_running(job.stack_id)
            self._report(job, wire.APPLIED, notices_message(notices))
            await self.push_containers(job.stack_id)
            log.info("stack_applied", stack_id=job.stack_id, job_id=job.job_id, changes=len(notices), swarm=True)
            await self._settle(job.stack_id)  # as on one machine: a task that dies at once fails the deploy
            return ""
        except (StackRejected, StackFailed, EngineError) as exc:
            return await self._failed(job, project, workdir, exc)

    async def _until_running(self, stack_id: str) -> None:
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
                break
            if loop.time() > deadline:
                raise StackFailed(f"the stack's services were not all running {self.start_seconds:.0f} s after deploy")
            await asyncio.sleep(0.25)

    async def _teardown(self, project: str, workdir: Path, stack_id: str) -> None:
        try:
            await self.swarm.remove(project)
        except EngineError as exc:
            log.error("stack_teardown_failed", stack_id=stack_id, project=project, error=str(exc))
        await asyncio.to_thread(shutil.rmtree, workdir, ignore_errors=True)

    async def _take_down(
        self, list_containers: Callable[[], Awaitable[list[dict]]], workdir: Path, fallback: set[str]
    ) -> set[str]:
        """`docker stack rm` of every stack the listed containers belong to (or
        the fallback ones when none is left); returns the stacks taken down."""
        existing = await list_containers()
        projects = {c["Labels"].get(NAMESPACE_LABEL) for c in existing if c.get("Labels")} - {None}
        projects = projects or fallback
        for project in sorted(projects):
            await self.swarm.remove(project)
        return projects


def with_service_labels(stack: dict) -> dict:
    """The agent's labels on each service too (not only its containers): the
    manager filters services and tasks by those."""
    for service in (stack.get("services") or {}).values():
        deploy = service.setdefault("deploy", {})
        deploy["labels"] = {**(deploy.get("labels") or {}), **(service.get("labels") or {})}
    return stack

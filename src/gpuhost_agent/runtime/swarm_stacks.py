"""Stacks on a Swarm, through the manager's engine: the adapter to Docker's
Swarm API and to `docker stack deploy`.

Deploying is `docker stack deploy`, exactly as Portainer does for Swarm
environments: the Engine API has no stack call, and the CLI's translation
of a Compose file into services, networks and volumes is the reference
(writing our own would drift from it). The file goes in on stdin
(`-c -`), with `--resolve-image never` (nodes run the images they have;
no registry is asked for a digest) and `--prune` (a service the new file
no longer has goes). Everything else (nodes, services, tasks) is the Engine
API, like the rest of the agent (runtime/engine/client.py).

A Swarm refuses its first deploys for a few seconds after it forms or a
node joins ("node is missing network attachments"); that answer is tried
again, within `settle_seconds`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.compose import STACK_NAMESPACE_LABEL
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.runtime.engine.records import DiskUsage
from gpuhost_agent.runtime.host_process import HostProcesses

NAMESPACE_LABEL = STACK_NAMESPACE_LABEL
NOT_READY = "missing network attachments"
# `docker stack rm` answers that mean the stack is gone or on its way
GONE_OR_GOING = ("Nothing found in stack", "is in use by task", "not found")
DEPLOY_SECONDS = 120.0
REMOVE_RETRY_SECONDS = 0.5  # between the looks (and `docker stack rm`s) while a stack goes


class SwarmStacks:
    def __init__(
        self,
        engine: DockerEngine,
        *,
        docker_cli: str = "docker",
        settle_seconds: float = 60.0,
        docker_config_dir: Path | None = None,
    ):
        """`docker_config_dir`: the agent's own docker config folder, the
        same Compose gets (runtime/compose.py, host_environment)."""
        self.engine = engine
        self.processes = HostProcesses(docker_config_dir)
        self.docker_cli = docker_cli
        self.settle_seconds = settle_seconds

    async def services(self, project: str) -> list[dict]:
        return await self.engine.swarm_list("services", f"{NAMESPACE_LABEL}={project}")

    async def tasks(self, project: str) -> list[dict]:
        return await self.engine.swarm_list("tasks", f"{NAMESPACE_LABEL}={project}")

    async def deploy(self, project: str, text: str) -> str:
        """`docker stack deploy` of `text` (the stack as JSON, which is YAML);
        what the CLI printed, or EngineError with its words."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settle_seconds
        while True:
            code, printed = await self._cli(
                "stack", "deploy", "--resolve-image", "never", "--prune", "-c", "-", project, stdin=text
            )
            if code == 0:
                return printed
            if NOT_READY not in printed or loop.time() > deadline:
                raise EngineError(f"docker stack deploy failed: {_last_line(printed)}")
            await asyncio.sleep(1.0)

    async def remove(self, project: str, *, timeout: float = 60.0) -> None:
        """`docker stack rm`, again until its services and networks are gone.
        The CLI returns before Swarm has stopped the tasks, and a network a
        task still holds is refused ("is in use by task", moby/moby#30942):
        the stack's services are gone then but its network is left, and only
        another `docker stack rm` once the task is gone removes it. That one
        may find the network already gone ("not found"), which is the aim."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            code, printed = await self._cli("stack", "rm", project)
            if code != 0 and not any(words in printed for words in GONE_OR_GOING):
                raise EngineError(f"docker stack rm failed: {_last_line(printed)}")
            if not await self.services(project) and not await self._networks(project):
                return
            if loop.time() > deadline:
                raise EngineError(f"stack {project} was not gone {timeout:.0f} s after docker stack rm")
            await asyncio.sleep(REMOVE_RETRY_SECONDS)

    async def restart_service(self, name: str) -> None:
        """`docker service update --force`: a new task for the service, on the
        node its constraint names. Swarm starts none by itself for a service
        whose restart policy is `none` after its machine was away."""
        code, printed = await self._cli("service", "update", "--force", "--detach", "--quiet", name)
        if code != 0:
            raise EngineError(f"docker service update --force {name} failed: {_last_line(printed)}")

    async def stop(self, project: str) -> None:
        """Every service of the stack scaled to no task: its containers stop on
        whatever machine they run, and stay stopped (Swarm would start a new
        task for a container merely stopped), while the stack's definition,
        networks and volumes stay: deploying it again brings it back."""
        names = [str((service.get("Spec") or {}).get("Name")) for service in await self.services(project)]
        if not names:
            return
        code, printed = await self._cli("service", "scale", "--detach", *(f"{name}=0" for name in names))
        if code != 0:
            raise EngineError(f"docker service scale failed: {_last_line(printed)}")

    async def _networks(self, project: str) -> list[dict]:
        return await self.engine.swarm_list("networks", f"{NAMESPACE_LABEL}={project}")

    async def _cli(self, *args: str, stdin: str | None = None) -> tuple[int, str]:
        """The docker CLI against the same engine as the rest of the agent
        (DOCKER_HOST), through the runner Compose goes through too
        (runtime/host_process.py): its fixed environment, since `docker stack
        deploy` interpolates the file with its environment, so the agent's
        own variables must not be there to be read."""
        try:
            process = await self.processes.start([self.docker_cli, *args], stdin=True, merge_output=True)
        except OSError as exc:
            raise EngineError(f"the docker CLI ({self.docker_cli}) cannot run: {exc.strerror or exc}") from None
        try:
            code, printed, _ = await self.processes.finish(process, timeout=DEPLOY_SECONDS, text=stdin or "")
        except asyncio.TimeoutError:
            raise EngineError(f"docker {args[0]} {args[1]} did not finish within {DEPLOY_SECONDS:.0f} s") from None
        return code, printed


def rental_disk_figures(df: DiskUsage) -> DiskUsage:
    """What of `GET /system/df` tells each rental's use of this machine's disk
    (core/disk_watch.py): the agent's containers' writable layers by rental,
    and the stacks' volumes by stack. A Swarm machine's agent answers the
    leader with this (streams/door.py), nothing of the host's own."""
    containers = [
        {"Labels": {wire.LABEL_RENTAL: labels[wire.LABEL_RENTAL]}, "SizeRw": container.get("SizeRw") or 0}
        for container in df.get("Containers") or []
        if (labels := container.get("Labels") or {}).get(wire.LABEL_MANAGED) == "true" and labels.get(wire.LABEL_RENTAL)
    ]
    volumes = [
        {
            "Labels": {NAMESPACE_LABEL: labels[NAMESPACE_LABEL]},
            "UsageData": {"Size": (volume.get("UsageData") or {}).get("Size")},
        }
        for volume in df.get("Volumes") or []
        if (labels := volume.get("Labels") or {}).get(NAMESPACE_LABEL)
    ]
    return {"Containers": containers, "Volumes": volumes}


def _last_line(printed: str) -> str:
    lines = [line for line in printed.strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else "no output"

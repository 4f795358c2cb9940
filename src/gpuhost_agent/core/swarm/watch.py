"""The leader's watch over the other machines of a Swarm environment.

On one machine the engine's event stream tells the agent at once when a
container stops. A Swarm manager's events cover only its own containers, so
the leader asks the manager instead, every few seconds: the nodes (a machine
down, drained or paused) and the tasks of the environment (a container
elsewhere that stopped or cannot run). Both answers are small, so asking
often costs little.

- A machine that goes away: its GPUs leave the listing's `availableGPUs` at
  once (a probe and a heartbeat out of turn, not at the next systemData), and
  every stack with a container there says so in `errorMsg`. The agent pins
  each service to its node, so Swarm does not move it elsewhere.
- The machine back: a container that was running there runs again, as one
  machine's agent restores what an engine restart stopped. Swarm restarts a
  service whose restart policy allows it; for the others (Compose's default
  `restart: "no"` is Swarm's `none`) the leader forces a new task
  (`docker service update --force`). Once all run, the message is cleared.
- A container on another machine that stops by itself is reported as on one
  machine (core/containers/watch.py pushes the list and the errorMsg), at
  once when that machine's agent serves its events (core/swarm/worker_events.py,
  followed for every ready machine but this one), else at the next look.

The decisions (which machine is unwell, the words for a stack) are pure
functions here; SwarmWatch only asks and passes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.containers.watch import ContainerWatch
from gpuhost_agent.core.stacks.container_list import service_name, stack_id_of
from gpuhost_agent.core.swarm.worker_events import WorkerEvents
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.runtime.engine.records import ContainerSummary, NodeSummary
from gpuhost_agent.runtime.swarm_tasks import NODE_LABEL

log = get_logger(__name__)

WATCH_SECONDS = 5.0  # how often the leader asks the manager; Swarm itself needs ~10 s to call a machine down
RESTORE_SECONDS = 120.0  # after a machine is back, how long its stranded services are watched
ENDED = ("exited", "dead")


def machine_problems(nodes: Sequence[NodeSummary]) -> dict[str, str]:
    """Node id -> why its machine runs nothing now, for each node that is not
    ready and active."""
    problems = {}
    for node in nodes:
        node_id = str(node.get("ID") or "")
        state = str((node.get("Status") or {}).get("State") or "unknown")
        availability = str((node.get("Spec") or {}).get("Availability") or "active")
        if not node_id or (state == "ready" and availability == "active"):
            continue
        host = str((node.get("Description") or {}).get("Hostname") or "?")
        why = f"is {state}" if state != "ready" else f"is {availability} in the Swarm"
        problems[node_id] = f"machine {host} (Swarm node {node_id[:12]}) {why}"
    return problems


def stack_machine_error(raw_list: Sequence[ContainerSummary], problems: Mapping[str, str]) -> str:
    """The errorMsg part that names the stack's containers on unwell machines."""
    by_node: dict[str, list[str]] = {}
    for raw in raw_list:
        node = str((raw.get("Labels") or {}).get(NODE_LABEL) or "")
        if node in problems and raw.get("State") != "exited":  # one that completed has nothing to run
            by_node.setdefault(node, []).append(service_name(raw))
    return "; ".join(
        f"{problems[node]}: container {', '.join(sorted(names))} cannot run until it is back"
        for node, names in sorted(by_node.items())
    )


class SwarmMachines:
    """The unwell machines the last look found, shared by the watch (which
    updates it) and the container watch (which words a stack's errorMsg)."""

    def __init__(self) -> None:
        self.problems: dict[str, str] = {}

    def stack_error(self, raw_list: Sequence[ContainerSummary]) -> str:
        return stack_machine_error(raw_list, self.problems)


class SwarmWatch:
    name = "swarm_watch"  # its job on the agent's schedule

    def __init__(
        self,
        engine: DockerEngine,
        container_watch: ContainerWatch,
        machines: SwarmMachines,
        env_id: Callable[[], str | None],
        machines_changed: Callable[[], Awaitable[None]],
        restart_service: Callable[[str], Awaitable[None]],
        *,
        interval: float = WATCH_SECONDS,
        worker_events: WorkerEvents | None = None,
    ):
        self.engine, self.container_watch, self.machines = engine, container_watch, machines
        self.env_id, self.machines_changed, self.interval = env_id, machines_changed, interval
        self.restart_service = restart_service
        self.worker_events = worker_events
        self._own_node: str | None = None  # this machine's node id, whose events the container watch follows
        self._seen: dict[str, tuple] = {}  # per stack: what its containers looked like last time
        # Services that were running on a machine when it went away: node -> service -> container id then.
        self._stranded: dict[str, dict[str, str]] = {}
        self._back_at: dict[str, float] = {}  # node -> loop time it was seen back

    async def poll(self) -> None:
        try:
            nodes = await self.engine.swarm_list("nodes")
            await self._follow(nodes)
            await self._nodes(nodes)
            await self._stacks()
        except EngineError as exc:
            log.warning("swarm_watch_failed", error=str(exc))

    async def _follow(self, nodes: list[NodeSummary]) -> None:
        """The other ready machines' container events, followed through their agents."""
        if self.worker_events is None:
            return
        if self._own_node is None:
            self._own_node = str(((await self.engine.info()).get("Swarm") or {}).get("NodeID") or "")
        ready = {str(node.get("ID")) for node in nodes if (node.get("Status") or {}).get("State") == "ready"}
        self.worker_events.keep(ready - {self._own_node, "None", ""})

    async def stop(self) -> None:
        if self.worker_events is not None:
            await self.worker_events.stop()

    async def _nodes(self, nodes: list[NodeSummary]) -> None:
        problems = machine_problems(nodes)
        if problems == self.machines.problems:
            return
        for node_id in problems.keys() - self.machines.problems.keys():
            log.warning("swarm_machine_unwell", node_id=node_id, problem=problems[node_id])
        for node_id in self.machines.problems.keys() - problems.keys():
            log.info("swarm_machine_back", node_id=node_id, stranded=len(self._stranded.get(node_id, {})))
            self._back_at[node_id] = asyncio.get_running_loop().time()
        self.machines.problems = problems
        self._seen.clear()  # every stack is looked at again: its words may change
        await self.machines_changed()

    async def _stacks(self) -> None:
        env_id = self.env_id()
        if not env_id:
            return
        seen_at = asyncio.get_running_loop().time()
        by_stack: dict[str, list[ContainerSummary]] = {}
        containers = await self.engine.environment_containers(env_id)
        for container in containers:
            if stack_id := stack_id_of(container):
                by_stack.setdefault(stack_id, []).append(container)
        await self._restore(containers)
        for stack_id, raw in by_stack.items():
            looks = tuple(sorted((c.get("Id"), c.get("State"), (c.get("Labels") or {}).get(NODE_LABEL)) for c in raw))
            if self._seen.get(stack_id) != looks and await self.container_watch.push(
                stack_id, raw, seen_at, may_set_error=True
            ):
                self._seen[stack_id] = looks  # a busy stack is looked at again next time
        for gone in self._seen.keys() - by_stack.keys():
            del self._seen[gone]

    async def _restore(self, containers: list[ContainerSummary]) -> None:
        """Note what runs on an unwell machine; once it is back, start again
        what it ran (decided by restore_plan)."""
        now = asyncio.get_running_loop().time()
        for node_id in self.machines.problems:
            stranded = self._stranded.setdefault(node_id, {})
            for container in containers:
                labels = container.get("Labels") or {}
                if labels.get(NODE_LABEL) == node_id and container.get("State") == "running":
                    stranded.setdefault(swarm_service(container), str(container.get("Id") or ""))
        for node_id in list(self._stranded):
            if node_id in self.machines.problems:
                continue
            restart, settled = restore_plan(self._stranded[node_id], containers)
            for service in restart:
                try:
                    await self.restart_service(service)
                    log.info("swarm_service_restarted", node_id=node_id, service=service)
                except EngineError as exc:
                    log.warning("swarm_service_restart_failed", node_id=node_id, service=service, error=str(exc))
            for service in restart | settled:
                self._stranded[node_id].pop(service, None)
            if not self._stranded[node_id] or now - self._back_at.get(node_id, now) > RESTORE_SECONDS:
                del self._stranded[node_id]
                self._back_at.pop(node_id, None)


def swarm_service(container: ContainerSummary) -> str:
    """The Swarm service of a container of runtime/swarm_tasks.py (named <service>.<slot>.<task>)."""
    names = container.get("Names") or [""]
    return str(names[0]).lstrip("/").split(".")[0]


def restore_plan(stranded: Mapping[str, str], containers: Sequence[ContainerSummary]) -> tuple[set[str], set[str]]:
    """For a machine back: (services to restart, services that need nothing
    more). A service whose newest container ended needs a new task; one
    running in a new container was restarted by Swarm; one still shown with
    its container of before the outage, running, is Swarm's stale view until
    the machine reports (or it truly survived): it is looked at again."""
    newest = {swarm_service(c): c for c in containers if swarm_service(c) in stranded}
    restart, settled = set(), set()
    for service, before in stranded.items():
        container = newest.get(service)
        if container is None:
            settled.add(service)  # removed meanwhile
        elif container.get("State") in ENDED:
            restart.add(service)
        elif container.get("State") == "running" and str(container.get("Id") or "") != before:
            settled.add(service)
    return restart, settled

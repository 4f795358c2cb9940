"""Containers on other machines of a Swarm environment: their logs through
the manager (the leader's engine), the rest through their machine's agent.

The manager keeps no container of another machine, but it knows its task
and serves that task's log (`GET /tasks/{id}/logs`: the same multiplexed,
timestamped frames as a container's, the API `docker service logs` reads).
So when this machine's engine does not know a container, it is looked up
among the manager's tasks by its container id, its inspect is made from the
task (labels, TTY, running or how it ended), and its log is read as the
task's. Everything the log pump does (follow, resume across a restart, the
stall check) works the same.

A terminal, an SSH session, SFTP and a tunnel need the container's own
machine. So the inspect is asked of the agent on the node the task runs on
(runtime/door_client.py), and the execs made, the files opened and the
connections dialled for that container go there too (docs/swarm.md). A
container on another machine is never handled with this machine's pids.
Where it runs is said beside its inspect, never written into it
(locate's ContainerAt, runtime/container_at.py): when the agent there is
silent, the answer says so, and the streams layer refuses all but its log.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
from collections.abc import Awaitable, Callable
from typing import cast

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.protocol.wire_system import MachineAnswer
from gpuhost_agent.runtime.container_at import ContainerAt
from gpuhost_agent.runtime.container_files import ContainerFiles
from gpuhost_agent.runtime.door_client import DoorClient
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.records import DiskFigures, EngineEvent
from gpuhost_agent.runtime.engine.streams import CHUNK_BYTES, ContainerGone, EngineStreams, EngineUnreachable, LogReader
from gpuhost_agent.runtime.netns_dial import dial_in_namespace

log = get_logger(__name__)

# Why a container on another machine cannot be reached (ContainerAt.unreachable): its agent is silent.
SILENT_AGENT = (
    "the container runs on another machine of this environment: its logs come through the Swarm's manager, "
    "a terminal, SSH or a tunnel through the agent on that machine (GPUHOST_SWARM=worker), which did not answer"
)
KEPT = 1024  # containers and execs remembered per machine they run on


class SwarmStreams(EngineStreams):
    def __init__(
        self,
        docker_host: str | None = None,
        *,
        timeout: float = 30,
        key: str | None = None,
        workers: dict[str, tuple[str, int]] | None = None,
        worker_port: int = 7072,
        tls: ssl.SSLContext | None = None,
        crl: str | None = None,
    ):
        """`crl`: the leader's revocation list, which each door is given (runtime/door_client.py)."""
        super().__init__(docker_host, timeout=timeout)
        self._crl = crl
        self._tasks: dict[str, str] = {}  # container id -> task id, for containers on other machines
        self._key, self._workers, self._worker_port = key, dict(workers or {}), worker_port
        self._tls = tls  # the leader's certificate for the doors (service/swarm_tls.py)
        self._remotes: dict[str, DoorClient] = {}  # node id -> its agent's door
        self._on: dict[str, DoorClient] = {}  # container id or exec id -> the door it is behind

    async def locate(self, container_id: str) -> ContainerAt:
        """Here when this machine's engine knows the container; else on its
        task's node, as that machine's agent inspects it, or as the manager's
        task says when that agent is silent (then nothing but its log reaches it)."""
        try:
            return await super().locate(container_id)
        except ContainerGone:
            task = await self._task_of(container_id)
            if task is None:
                raise
        node = str(task.get("NodeID") or "")
        remote = await self._remote(node)
        if remote is not None:
            try:
                info = await remote.inspect(container_id)
                self._remember(container_id, remote)
                self._remember(str(info.get("Id") or ""), remote)
                return ContainerAt(info, machine=node)
            except EngineUnreachable as exc:
                log.warning("swarm_worker_unreachable", node_id=node, error=str(exc)[:300])
        return ContainerAt(task_inspect(task), machine=node, unreachable=SILENT_AGENT if node else None)

    async def inspect(self, container_id: str) -> dict:
        return (await self.locate(container_id)).info

    async def exec_create(self, container_id: str, command: list[str], env: dict[str, str], *, tty: bool = True) -> str:
        remote = self._on.get(container_id)
        if remote is None:
            return await super().exec_create(container_id, command, env, tty=tty)
        exec_id = await remote.exec_create(container_id, command, env, tty=tty)
        self._remember(exec_id, remote)
        return exec_id

    async def exec_start(self, exec_id: str, *, tty: bool = True) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        remote = self._on.get(exec_id)
        return await (remote.exec_start(exec_id, tty=tty) if remote else super().exec_start(exec_id, tty=tty))

    async def exec_resize(self, exec_id: str, *, rows: int, cols: int) -> None:
        remote = self._on.get(exec_id)
        await (remote.exec_resize if remote else super().exec_resize)(exec_id, rows=rows, cols=cols)

    async def exec_inspect(self, exec_id: str) -> dict:
        remote = self._on.get(exec_id)
        return await (remote.exec_inspect(exec_id) if remote else super().exec_inspect(exec_id))

    async def exec_exit_code(self, exec_id: str, wait: float) -> int | None:
        remote = self._on.get(exec_id)
        return await (remote.exec_exit_code(exec_id, wait) if remote else super().exec_exit_code(exec_id, wait))

    async def dial(
        self, container: ContainerAt, address: str, port: int, *, tls: ssl.SSLContext | None, timeout: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A tunnel's last hop to a Swarm container: its networks are overlays,
        reachable only from inside its network namespace. On this machine the
        leader dials from there itself; on another, that machine's agent does."""
        if container.machine:
            return await self._door(container).dial(container, address, port, tls=tls, timeout=timeout)
        pid = int((container.info.get("State") or {}).get("Pid") or 0)
        return await dial_in_namespace(pid, address, port, timeout, tls, container_id=container.id)

    async def open_files(self, container: ContainerAt) -> ContainerFiles:
        if container.machine:
            return await self._door(container).open_files(container)
        return await super().open_files(container)

    async def hang_up(self, exec_id: str, container_id: str) -> None:
        remote = self._on.get(exec_id)
        await (remote.hang_up if remote else super().hang_up)(exec_id, container_id)

    async def signal(self, exec_id: str, container_id: str, signum: int) -> bool:
        remote = self._on.get(exec_id)
        return await (remote.signal if remote else super().signal)(exec_id, container_id, signum)

    async def machine_reports(self, node_ids: list[str], timeout: float, live: bool) -> dict[str, MachineAnswer]:
        """Each node's report from its agent (`live`: its GPUs' figures alone),
        or {"error": why not}, asked at once; `timeout`: how long a heartbeat
        or a probe may wait for one."""
        answers = await self._ask_each(node_ids, timeout, lambda remote: remote.machine(live))
        return cast("dict[str, MachineAnswer]", answers)

    async def disk_figures(self, node_ids: list[str], timeout: float) -> dict[str, DiskFigures]:
        """Each node's rentals' use of its disk from its agent, or {"error": why not}."""
        answers = await self._ask_each(node_ids, timeout, lambda remote: remote.disk())
        return cast("dict[str, DiskFigures]", answers)

    async def follow_events(self, node: str, on_event: Callable[[EngineEvent], None]) -> None:
        """That machine's container events, through its agent, until the stream ends."""
        remote = await self._remote(node)
        if remote is None:
            raise EngineUnreachable("no address for the agent on this machine")
        await remote.follow_events(on_event)

    async def _ask_each(
        self, node_ids: list[str], timeout: float, ask: Callable[[DoorClient], Awaitable[dict]]
    ) -> dict[str, dict]:
        async def one(node: str) -> dict:
            remote = await self._remote(node)
            if remote is None:
                return {"error": "no address for the agent on this machine"}
            try:
                return await asyncio.wait_for(ask(remote), timeout)
            except (EngineError, asyncio.TimeoutError) as exc:
                return {"error": f"the agent on this machine did not answer: {type(exc).__name__}: {exc}"[:300]}

        answers = await asyncio.gather(*(one(node) for node in node_ids))
        return dict(zip(node_ids, answers, strict=True))

    def _door(self, container: ContainerAt) -> DoorClient:
        """The door of the container's machine. Never this machine's engine: its
        pids and addresses would name something else here."""
        remote = self._on.get(container.id)
        if remote is None or container.unreachable is not None:
            raise OSError(errno.EHOSTUNREACH, "the agent on the container's machine does not answer")
        return remote

    async def close(self) -> None:
        for remote in self._remotes.values():
            await remote.close()
        self._remotes.clear()
        await super().close()

    def _remember(self, ident: str, remote: DoorClient) -> None:
        if ident:
            self._on.pop(ident, None)
            self._on[ident] = remote
            while len(self._on) > KEPT:
                self._on.pop(next(iter(self._on)))

    async def _remote(self, node: str) -> DoorClient | None:
        """The door of the agent on `node`, None without the environment's key
        and the leader's certificate, or an address for it."""
        if not self._key or self._tls is None or not node:
            return None
        if node not in self._remotes:
            address = self._workers.get(node)
            if address is None:
                try:
                    addr = str(
                        ((await self._call("GET", f"/nodes/{node}") or {}).get("Status") or {}).get("Addr") or ""
                    )
                except EngineError:
                    return None
                if not addr or addr == "0.0.0.0":
                    return None
                address = (addr, self._worker_port)
            self._remotes[node] = DoorClient(*address, self._key, self._tls, node, self._crl)
        return self._remotes[node]

    async def open_logs(
        self, container_id: str, *, follow: bool, tail: int | None, since: str | None, chunk_bytes: int = CHUNK_BYTES
    ) -> LogReader:
        task_id = self._tasks.get(container_id)
        if task_id is None:
            try:
                return await super().open_logs(
                    container_id, follow=follow, tail=tail, since=since, chunk_bytes=chunk_bytes
                )
            except ContainerGone:
                task = await self._task_of(container_id)
                if task is None:
                    raise
                task_id = str(task["ID"])
        return await self._open_log(
            f"/tasks/{task_id}/logs", follow=follow, tail=tail, since=since, chunk_bytes=chunk_bytes
        )

    async def _task_of(self, container_id: str) -> dict | None:
        """The manager's newest task whose container has this id (or id prefix)."""
        if len(container_id) < 12:
            return None
        tasks = await self._call("GET", "/tasks") or []
        found = [
            task
            for task in tasks
            if isinstance(task, dict)
            and str(((task.get("Status") or {}).get("ContainerStatus") or {}).get("ContainerID") or "").startswith(
                container_id
            )
        ]
        if not found:
            return None
        task = max(found, key=lambda t: int((t.get("Version") or {}).get("Index") or 0))
        full_id = str(task["Status"]["ContainerStatus"]["ContainerID"])
        self._tasks[container_id] = self._tasks[full_id] = str(task["ID"])
        return task


def task_inspect(task: dict) -> dict:
    """What the stream layer reads of `docker inspect`, from a task."""
    status = task.get("Status") or {}
    spec = (task.get("Spec") or {}).get("ContainerSpec") or {}
    container = status.get("ContainerStatus") or {}
    running = status.get("State") == "running"
    return {
        "Id": container.get("ContainerID") or "",
        "Config": {"Tty": bool(spec.get("TTY")), "Labels": dict(spec.get("Labels") or {}), "ExposedPorts": {}},
        "State": {
            "Running": running,
            "Restarting": False,
            "StartedAt": status.get("Timestamp") if running else None,
            "FinishedAt": None if running else status.get("Timestamp"),
            "ExitCode": container.get("ExitCode"),
            "Status": "running" if running else "exited",
        },
        "NetworkSettings": {"Networks": {}},
    }

"""Logs of a container on another machine of a Swarm environment, through
the manager (the leader's engine).

The manager keeps no container of another machine, but it knows its task
and serves that task's log (`GET /tasks/{id}/logs`: the same multiplexed,
timestamped frames as a container's, the API `docker service logs` reads).
So when this machine's engine does not know a container, it is looked up
among the manager's tasks by its container id, its inspect is made from the
task (labels, TTY, running or how it ended), and its log is read as the
task's. Everything the log pump does (follow, resume across a restart, the
stall check) works the same. A terminal or a tunnel needs the container's
own engine, so they stay with the agent on that machine (docs/swarm.md).
"""

from __future__ import annotations

from gpuhost_agent.runtime.engine_streams import CHUNK_BYTES, ContainerGone, EngineStreams, LogReader

REMOTE_NODE = "GpuhostNode"  # in an inspect made from a task: the node that runs the container


class SwarmStreams(EngineStreams):
    def __init__(self, docker_host: str | None = None, *, timeout: float = 30):
        super().__init__(docker_host, timeout=timeout)
        self._tasks: dict[str, str] = {}  # container id -> task id, for containers on other machines

    async def inspect(self, container_id: str) -> dict:
        try:
            return await super().inspect(container_id)
        except ContainerGone:
            task = await self._task_of(container_id)
            if task is None:
                raise
            return task_inspect(task)

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
        REMOTE_NODE: task.get("NodeID"),
        "NetworkSettings": {"Networks": {}},
    }

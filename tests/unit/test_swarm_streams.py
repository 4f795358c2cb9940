"""SwarmStreams (runtime/swarm_streams.py): a container on another machine is
never handled with this machine's pids or network. Its file session, tunnel
hop and exec hang-up go to that machine's agent, or fail saying it is silent;
nothing starts here. The engine is never reached in these cases. Where a
container runs is its locate's answer (a ContainerAt), never a key written
into the engine's inspect."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhost_agent.runtime import container_files
from gpuhost_agent.runtime.engine.streams import ContainerAt, ContainerGone, EngineStreams, EngineUnreachable
from gpuhost_agent.runtime.swarm_streams import SILENT_AGENT, SwarmStreams

CONTAINER = "c" * 64
INFO = {"Id": CONTAINER, "State": {"Running": True, "Pid": 4242}}
# A container on node n2 as made from its task: the manager's answer, no agent there.
ON_ANOTHER_MACHINE = ContainerAt(INFO, machine="n2", unreachable=SILENT_AGENT)
TASK = {
    "ID": "task-1",
    "NodeID": "n2",
    "Version": {"Index": 7},
    "Spec": {"ContainerSpec": {"Labels": {"a": "b"}, "TTY": True}},
    "Status": {"State": "running", "Timestamp": "2026-11-27T00:00:00Z", "ContainerStatus": {"ContainerID": CONTAINER}},
}


@pytest.fixture
def started_here(monkeypatch) -> list:
    """Every file helper started on this machine."""
    started: list = []

    async def start_helper(pid: int, user: str):
        started.append(pid)
        raise AssertionError("a file helper started on the leader for a container elsewhere")

    monkeypatch.setattr(container_files, "start_helper", start_helper)
    return started


async def test_no_file_session_or_tunnel_here_for_a_container_elsewhere(started_here) -> None:
    streams = SwarmStreams("unix:///nonexistent/docker.sock", key="k" * 16)
    try:
        # silent, or answering but not remembered (no door known for it): never this machine's pids
        for container in (ON_ANOTHER_MACHINE, ContainerAt(INFO, machine="n2")):
            with pytest.raises(OSError, match="does not answer"):
                await streams.open_files(container)
            with pytest.raises(OSError, match="does not answer"):
                await streams.dial(container, "10.0.1.5", 8080, tls=None, timeout=1)
    finally:
        await streams.close()
    assert started_here == []


class _Manager(SwarmStreams):
    """The manager's engine: it knows the task, not the container."""

    async def _call(self, method: str, path: str, **_kw: Any) -> Any:
        if path.startswith("/containers/"):
            raise ContainerGone("No such container")
        if path == "/tasks":
            return [TASK]
        raise AssertionError(f"the manager was asked {method} {path}")


class _Door(EngineStreams):
    """The agent on n2: answering with its engine's inspect, or silent."""

    def __init__(self, silent: bool):
        super().__init__("unix:///nonexistent/docker.sock")
        self.silent = silent

    async def inspect(self, container_id: str) -> dict:
        if self.silent:
            raise EngineUnreachable("the agent's door: connect failed")
        return {**INFO, "Config": {"Labels": {"a": "b"}}}


async def test_a_container_elsewhere_is_located_on_its_machine_reachable_or_not(monkeypatch) -> None:
    for door, reachable in ((None, False), (_Door(silent=True), False), (_Door(silent=False), True)):
        streams = _Manager("unix:///nonexistent/docker.sock", key="k" * 16)

        async def remote(node: str, door: _Door | None = door) -> _Door | None:
            assert node == "n2"
            return door

        monkeypatch.setattr(streams, "_remote", remote)
        container = await streams.locate(CONTAINER)
        assert container.machine == "n2" and container.id == CONTAINER
        if reachable:
            assert container.unreachable is None and container.info == {**INFO, "Config": {"Labels": {"a": "b"}}}
        else:  # known from its task: its log comes through the manager, nothing else reaches it
            assert container.unreachable == SILENT_AGENT
            assert "another machine" in SILENT_AGENT and "did not answer" in SILENT_AGENT
            assert container.info["Config"]["Labels"] == {"a": "b"} and container.info["State"]["Running"]
        assert await streams.inspect(CONTAINER) == container.info  # the engine's inspect, nothing of ours in it
        assert not [key for key in container.info if key.startswith("Gpuhost")]


async def test_one_machine_has_every_container_here_and_reachable(monkeypatch) -> None:
    streams = EngineStreams("unix:///nonexistent/docker.sock")

    async def call(method: str, path: str, **_kw: Any) -> Any:
        return INFO

    monkeypatch.setattr(streams, "_call", call)
    assert await streams.locate(CONTAINER) == ContainerAt(INFO, machine="", unreachable=None)

"""SwarmStreams (runtime/swarm_streams.py): a container on another machine is
never handled with this machine's pids or network. Its file session, tunnel
hop and exec hang-up go to that machine's agent, or fail saying it is silent;
nothing starts here. The engine is never reached in these cases."""

from __future__ import annotations

import pytest

from gpuhost_agent.runtime import container_files
from gpuhost_agent.runtime.swarm_streams import REMOTE_NODE, REMOTE_WORKER, SwarmStreams

CONTAINER = "c" * 64
# An inspect of a container on node n2 made from its task: the manager's answer, no agent there.
ON_ANOTHER_MACHINE = {"Id": CONTAINER, "State": {"Running": True, "Pid": 4242}, REMOTE_NODE: "n2"}


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
        for info in (ON_ANOTHER_MACHINE, {**ON_ANOTHER_MACHINE, REMOTE_WORKER: True}):
            with pytest.raises(OSError, match="does not answer"):
                await streams.open_files(info)
            with pytest.raises(OSError, match="does not answer"):
                await streams.dial(info, "10.0.1.5", 8080, tls=None, timeout=1)
    finally:
        await streams.close()
    assert started_here == []

"""runtime/exec_hangup.py with real processes: a "container" made with
`unshare --pid --fork` (its init in a pid namespace of its own, in a cgroup
named like a container's) and an "exec" in it (a session leader). The
session is hung up only when the container's pid is confirmed the
container's: asked as another container (its pid recycled, as the agent
would see it), nothing is signalled."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost_agent.runtime import exec_hangup

HIERARCHY = Path("/sys/fs/cgroup/pids")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (HIERARCHY / "cgroup.procs").exists(),
    reason="needs root (unshare --pid) and a cgroup v1 pids hierarchy",
)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        found += [int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def container() -> Iterator[tuple[int, int, str]]:
    """(the container's init, the exec's pid, the container's id), as host pids."""
    container_id = uuid.uuid4().hex * 2
    group = HIERARCHY / f"gpuhost-test-{container_id}"
    group.mkdir()
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "sh", "-c", "setsid sleep 60 & wait"])
    try:
        deadline = time.monotonic() + 5
        while not (init := _children(outer.pid)) or not _children(init[0]):
            assert time.monotonic() < deadline, "the container's processes did not start"
            time.sleep(0.02)
        (group / "cgroup.procs").write_text(str(init[0]))
        yield init[0], _children(init[0])[0], container_id
    finally:
        outer.kill()
        outer.wait()
        for pid in (group / "cgroup.procs").read_text().split():
            os.kill(int(pid), 9)
        deadline = time.monotonic() + 5
        while (group / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.02)
        group.rmdir()


def test_the_session_is_hung_up_only_when_the_pid_is_the_containers(container) -> None:
    init, exec_pid, container_id = container
    other = uuid.uuid4().hex * 2
    assert not exec_hangup.signal_exec(exec_pid, init, 0, other)
    asyncio.run(exec_hangup.hang_up(exec_pid, init, container_id=other, kill_after=0.2))
    assert _alive(exec_pid)  # another container's pid (a recycled one): nothing signalled
    asyncio.run(exec_hangup.hang_up(exec_pid, os.getpid(), container_id=container_id, kill_after=0.2))
    assert _alive(exec_pid)  # a host process as the container's init: nothing signalled
    assert exec_hangup.signal_exec(exec_pid, init, 0, container_id)
    asyncio.run(exec_hangup.hang_up(exec_pid, init, container_id=container_id, kill_after=0.2))
    deadline = time.monotonic() + 5
    while _alive(exec_pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(exec_pid)

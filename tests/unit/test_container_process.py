"""runtime/container_process.py with real processes: a pid is acted on only
while it is the container's (its cgroups name the container's id, and its
pidfd, taken first, is still alive after everything was opened).

A "container" here is a child process moved into a cgroup whose name is a
container id, as Docker names them (/docker/<id>); the host's own processes
and a process in another container's cgroup are not it."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost_agent.runtime.container_process import PinnedProcess, ProcessGone, ids_in, names_container

HIERARCHY = Path("/sys/fs/cgroup/pids")


def _usable() -> bool:
    return os.geteuid() == 0 and (HIERARCHY / "cgroup.procs").exists() and os.access(HIERARCHY, os.W_OK)


needs_cgroups = pytest.mark.skipif(not _usable(), reason="needs root and a writable cgroup v1 pids hierarchy")


def in_container_cgroup(command: list[str]) -> Iterator[tuple[subprocess.Popen, str]]:
    container_id = uuid.uuid4().hex * 2
    group = HIERARCHY / f"gpuhost-test-{container_id}"
    group.mkdir()
    process = subprocess.Popen(command)
    try:
        (group / "cgroup.procs").write_text(str(process.pid))
        yield process, container_id
    finally:
        process.kill()
        process.wait()
        group.rmdir()


@pytest.fixture
def container() -> Iterator[tuple[subprocess.Popen, str]]:
    yield from in_container_cgroup(["sleep", "60"])


def test_the_ids_a_cgroup_file_names() -> None:
    one, two = "a" * 64, "b" * 64
    assert ids_in(f"4:memory:/docker/{one}\n0::/docker/{one}\n") == {one}
    assert ids_in(f"1:name=systemd:/system.slice/docker-{one}.scope\n") == {one}
    assert ids_in(f"4:memory:/gpuhost-agent/r-{two}/{one}\n") == {one}  # only the last name counts
    assert ids_in("4:memory:/user.slice\n0::/init.scope\n") == set()
    assert names_container(f"0::/docker/{one}\n", one)
    assert not names_container(f"0::/docker/{one}\n", two)
    assert not names_container(f"0::/docker/{one}\n4:pids:/docker/{two}\n", one)
    assert not names_container(f"0::/docker/{one}\n", one[:12])  # the full id only
    assert not names_container("0::/system.slice/sshd.service\n", "")  # no id: never a host process


@needs_cgroups
def test_the_containers_process_is_confirmed(container) -> None:
    process, container_id = container
    with PinnedProcess(process.pid, container_id) as pinned:
        fd = pinned.open("ns/net")
        assert container_id in pinned.confirm()
        os.close(fd)


@needs_cgroups
def test_a_process_of_another_container_or_of_the_host_is_refused(container) -> None:
    process, _container_id = container
    for pid, asked in ((process.pid, uuid.uuid4().hex * 2), (os.getpid(), uuid.uuid4().hex * 2), (1, "")):
        with PinnedProcess(pid, asked) as pinned, pytest.raises(ProcessGone, match="not the container's"):
            pinned.confirm()


@needs_cgroups
def test_a_pid_that_ended_or_was_recycled_after_the_pidfd_is_refused(container) -> None:
    process, container_id = container
    pinned = PinnedProcess(process.pid, container_id)
    process.kill()
    process.wait()  # reaped: the pid is free for the next process
    with pytest.raises(ProcessGone, match="gone|ended"):
        pinned.confirm()
    # The pid handed to another process of the same cgroup between the pidfd and
    # the checks: /proc/PID reads say "the container's", the pidfd says it ended.
    for later, later_id in in_container_cgroup(["sleep", "60"]):
        pinned.pid, pinned.container_id = later.pid, later_id
        with pytest.raises(ProcessGone, match="ended"):
            pinned.confirm()
    pinned.close()
    with pytest.raises(ProcessGone, match="gone"):
        PinnedProcess(process.pid, container_id)  # no such process any more (unless recycled: then refused above)
    with pytest.raises(ProcessGone, match="not running"):
        PinnedProcess(0, container_id)

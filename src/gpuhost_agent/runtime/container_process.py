"""A container's init process, pinned: what is opened from /proc/PID is the container's.

The engine's inspect gives a pid; by the time the agent opens /proc/PID the
container may have stopped and the pid been handed to another process (a
host daemon, another renter's container). So a caller that acts on a
container through /proc (the SFTP helper: its root and cgroups; a Swarm
tunnel: its network namespace) pins the pid first:

1. a pidfd of the pid is taken (it names that one process for good);
2. whatever is needed is opened from /proc/PID;
3. /proc/PID/cgroup is read and must name the container's id, and no other;
4. the pidfd must still name a live process, so the pid was not recycled
   between 1 and 3 (and what 2 opened belongs to the process 3 checked).

Any failure refuses: ProcessGone (an OSError, ESRCH) says why.
"""

from __future__ import annotations

import errno
import os
import re
import signal

from gpuhost_agent.errors import OutsideFailure

CONTAINER_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
MAX_PROC_FILE = 64 * 1024


class ProcessGone(OutsideFailure, OSError):
    """The pid is not (or no longer) the container's process."""

    def __init__(self, message: str):
        super().__init__(errno.ESRCH, message)


def ids_in(cgroup: str) -> set[str]:
    """The container ids that end the paths of /proc/PID/cgroup (`/docker/<id>`,
    `.../docker-<id>.scope`, `/gpuhost-agent/r-<rental>/<id>`): the
    containers whose cgroups the process is in."""
    found: set[str] = set()
    for line in cgroup.splitlines():
        last = line.split(":", 2)[-1].rstrip("/").rpartition("/")[2]
        found.update(CONTAINER_ID.findall(last))
    return found


def names_container(cgroup: str, container_id: str) -> bool:
    """Whether the cgroups are the container's: its id, and no other. Without
    an id (an older caller), one container's, whichever: never a host process."""
    found = ids_in(cgroup)
    if not container_id:
        return len(found) == 1
    return bool(CONTAINER_ID.fullmatch(container_id)) and found == {container_id}


class PinnedProcess:
    """A container's init, by pid, held by a pidfd until close()."""

    def __init__(self, pid: int, container_id: str = ""):
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ProcessGone("the container has no process (not running)")
        self.pid, self.container_id = pid, container_id
        try:
            self.pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            raise ProcessGone(f"the container's process {pid} is gone") from None

    def open(self, name: str, flags: int = os.O_RDONLY) -> int:
        """An fd of /proc/PID/`name` (ns/net, root, ...)."""
        return os.open(f"/proc/{self.pid}/{name}", flags | os.O_CLOEXEC)

    def read(self, name: str) -> str:
        fd = self.open(name)
        try:
            return os.read(fd, MAX_PROC_FILE).decode("ascii", "replace")
        finally:
            os.close(fd)

    def confirm(self) -> str:
        """Check 3 and 4 (after everything needed was opened); the cgroup file read."""
        try:
            cgroup = self.read("cgroup")
        except (FileNotFoundError, ProcessLookupError):
            raise ProcessGone(f"the container's process {self.pid} is gone") from None
        if not names_container(cgroup, self.container_id):
            raise ProcessGone(f"process {self.pid} is not the container's (its cgroups name another)")
        try:
            signal.pidfd_send_signal(self.pidfd, 0)
        except ProcessLookupError:
            raise ProcessGone(f"the container's process {self.pid} ended while it was opened") from None
        return cgroup

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1

    def __enter__(self) -> PinnedProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

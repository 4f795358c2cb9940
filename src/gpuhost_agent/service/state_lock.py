"""One agent per state directory, said before anything starts.

Two agents on one state directory would share its database, its keys and
the GPU ledger, and the second would find out only when its status socket
was taken, after it had printed its banner and opened a session. An
exclusive `flock` on `<state_dir>/agent.lock`, taken first and held for the
process's life, refuses the second at once, naming the first by its pid.
The kernel drops the lock when the process ends, however it ends, so a
crashed agent never leaves it behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from gpuhost_agent.errors import OutsideFailure

LOCK_FILE = "agent.lock"


class StateInUse(OutsideFailure, OSError):
    pass


class StateLock:
    def __init__(self, state_dir: Path):
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None

    def take(self) -> None:
        """Hold the lock, or StateInUse naming the agent that holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StateInUse(
                f"another gpuhost-agent (pid {holder}) runs on the state directory {self.path.parent}: "
                f"stop it first ({how_to_stop(holder)}), or give this one its own with --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def how_to_stop(pid: str) -> str:
    """The command that stops the agent `pid` the way it was started: its
    systemd unit when it runs in one (its cgroup says which), else its pid."""
    try:
        cgroups = Path(f"/proc/{int(pid)}/cgroup").read_text()
    except (OSError, ValueError):
        return f"kill {pid}" if pid.isascii() and pid.isdigit() else "stop the agent that holds it"
    for line in cgroups.splitlines():
        unit = line.rsplit("/", 1)[-1]
        if unit.endswith(".service") and unit.startswith("gpuhost-agent"):
            return f"systemctl stop {unit.removesuffix('.service')}"
    return f"kill {int(pid)}: it stops as systemd stops it"

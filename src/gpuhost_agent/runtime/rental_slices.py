"""A systemd slice per rental: the one adapter to systemd, used when dockerd
runs with the `systemd` cgroup driver (Docker's default where systemd runs
cgroup v2, so most current hosts).

With that driver Docker accepts only a slice name as `cgroup_parent`, and
the cgroup belongs to systemd: writing limits into its files would be undone
at systemd's next reload. So the rental's limits are properties of a
transient slice that the agent starts through systemd's own D-Bus API
(`busctl call ... StartTransientUnit`, the call runc itself makes for each
container's scope); nothing to install, no unit file left on disk, and it
goes at reboot with the containers it held. A slice that already exists
(after an agent restart, or new limits) gets them with
`systemctl set-property --runtime`.

Names: `gpuhost-r<rental id>.slice`, a child of `gpuhost.slice`. A dash in a
slice name means one level down (`a-b.slice` is in `a.slice`), so the
rental id's own dashes are written as systemd writes them, `\\x2d`
(systemd-escape), and every rental is one level below `gpuhost.slice`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuhost_agent.errors import OutsideFailure

TOP_SLICE = "gpuhost.slice"
SYSTEMD_RUNNING = Path("/run/systemd/system")  # sd_booted(3): systemd is PID 1
COMMAND_SECONDS = 30
USEC_PER_SEC = 1_000_000

# systemd's words for org.freedesktop.systemd1.UnitExists, which busctl prints
# without the error's name: systemd 257 (Debian 13) says the first, older
# systemd the second. A restarted agent meets it for every rental's slice.
UNIT_EXISTS = ("was already loaded or has a fragment file", "already exists")

Runner = Callable[[list[str]], subprocess.CompletedProcess]
Which = Callable[[str], "str | None"]


class SliceError(OutsideFailure, RuntimeError):
    """systemd refused the rental's slice; the message has systemd's words."""


@dataclass(frozen=True)
class RentalLimits:
    """One rental's share, for all its containers together (a cgroup or a slice)."""

    memory_bytes: int
    cpus: float
    pids: int


def slice_name(rental_id: str) -> str:
    """`gpuhost-r<id>.slice`, the id's dashes escaped so it stays one level
    below gpuhost.slice (the id is already limited to [A-Za-z0-9_.-])."""
    return f"gpuhost-r{rental_id.replace('-', chr(92) + 'x2d')}.slice"


def cgroup_path(name: str) -> str:
    """Where systemd puts the slice's cgroup, relative to a hierarchy's root."""
    return f"{TOP_SLICE}/{name}"


def properties(limits: RentalLimits, cgroup_version: str) -> list[tuple[str, str, int]]:
    """The slice's properties as D-Bus (name, signature, value). cgroup v1
    knows only MemoryLimit; v2 also gets no swap, as the cgroupfs layout."""
    memory = "MemoryMax" if cgroup_version == "2" else "MemoryLimit"
    chosen = [
        (memory, "t", limits.memory_bytes),
        ("CPUQuotaPerSecUSec", "t", max(10_000, int(limits.cpus * USEC_PER_SEC))),
        ("TasksMax", "t", limits.pids),
    ]
    if cgroup_version == "2":
        chosen.append(("MemorySwapMax", "t", 0))
    return chosen


def start_command(name: str, chosen: list[tuple[str, str, int]]) -> list[str]:
    """busctl's StartTransientUnit(name, mode, properties, aux units)."""
    argv = [
        "busctl",
        "call",
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        "StartTransientUnit",
        "ssa(sv)a(sa(sv))",
        name,
        "fail",
        str(len(chosen) + 1),
        "Description",
        "s",
        "gpuhost-agent: one rental's containers",
    ]
    for key, signature, value in chosen:
        argv += [key, signature, str(value)]
    return [*argv, "0"]


def set_property_command(name: str, chosen: list[tuple[str, str, int]]) -> list[str]:
    """The same limits on a slice that already runs, in systemctl's words."""
    words = {
        "CPUQuotaPerSecUSec": lambda value: f"CPUQuota={value * 100 // USEC_PER_SEC}%",
    }
    settings = [words.get(key, lambda value, key=key: f"{key}={value}")(value) for key, _, value in chosen]
    return ["systemctl", "set-property", "--runtime", name, *settings]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_SECONDS, check=False)


class RentalSlices:
    """Start, limit and stop rentals' slices. Blocking: call off the loop."""

    def __init__(self, run: Runner = _run, systemd_running: Path = SYSTEMD_RUNNING, which: Which = shutil.which):
        self._run, self._systemd_running, self._which = run, systemd_running, which

    def unavailable(self) -> str | None:
        """Why slices cannot be made here, or None."""
        if not self._systemd_running.is_dir():
            return f"systemd is not running here ({self._systemd_running} is missing)"
        missing = [tool for tool in ("busctl", "systemctl") if self._which(tool) is None]
        if missing:
            return f"{' and '.join(missing)} not found on PATH ({os.environ.get('PATH', '')})"
        return None

    def apply(self, name: str, limits: RentalLimits, cgroup_version: str) -> None:
        chosen = properties(limits, cgroup_version)
        started = self._run(start_command(name, chosen))
        if started.returncode == 0:
            return
        if not any(words in (started.stderr or "") for words in UNIT_EXISTS):
            raise SliceError(f"systemd did not start {name}: {_said(started)}")
        updated = self._run(set_property_command(name, chosen))
        if updated.returncode != 0:
            raise SliceError(f"systemd did not limit {name}: {_said(updated)}")

    def stop(self, name: str) -> bool:
        stopped = self._run(["systemctl", "stop", name])
        return stopped.returncode == 0 or "not loaded" in (stopped.stderr or "")


def _said(done: subprocess.CompletedProcess) -> str:
    text = (done.stderr or done.stdout or "").strip().splitlines()
    return text[-1][:300] if text else f"exit status {done.returncode}"

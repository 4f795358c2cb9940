"""One cgroup per rental, the parent of every container of the rental: the one
adapter to the kernel's cgroup filesystem.

Each container already has the rental's share as its own limit, but a rental
of six services could then take six shares. So every container of a rental
is started with `cgroup_parent: /gpuhost-agent/r-<rental id>` and that cgroup
holds the rental's memory, CPU and process limits for all of them together:
the kernel OOM-kills inside the rental, never beside it.

With dockerd's `cgroupfs` cgroup driver the agent makes that cgroup itself,
on cgroup v1 (a directory per controller, as on this project's test machine)
and v2 (one unified tree). With the `systemd` driver Docker wants a slice
name as parent and systemd owns the cgroup, so the rental's limits are a
transient slice's properties (runtime/rental_slices.py); the limit events are
read from the slice's cgroup the same way. Where neither can be made,
`configure` says why and each container keeps the per-container limits only
(docs/sandbox-policy.md).
"""

from __future__ import annotations

import errno
import re
import subprocess
from pathlib import Path

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.errors import OutsideFailure
from gpuhost_agent.runtime.rental_slices import RentalLimits, RentalSlices, SliceError, cgroup_path, slice_name

__all__ = ["CgroupError", "RentalCgroups", "RentalLimits"]

log = get_logger(__name__)

SYSFS = Path("/sys/fs/cgroup")
TOP = "gpuhost-agent"
CPU_PERIOD_US = 100_000
V1_LIMITED = ("memory", "cpu", "pids")
LIMIT_SLACK_BYTES = 1 << 20  # a high-water mark this close to the limit met it
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class CgroupError(OutsideFailure, RuntimeError):
    """The rental's cgroup could not be made or limited; the message says where."""


class RentalCgroups:
    def __init__(self, root: Path = SYSFS, slices: RentalSlices | None = None):
        self.root = root
        self.slices = slices or RentalSlices()
        self.driver = "cgroupfs"  # or "systemd": who makes the rental's cgroup
        self.version: str | None = None  # "1" or "2" once configure() found a usable layout
        self.unavailable = "not configured yet"
        self._limit_events: dict[str, int] = {}  # v2: per rental, memory.events.local max when last read

    def configure(self, cgroup_driver: str, cgroup_version: str) -> str | None:
        """From `docker info` (CgroupDriver, CgroupVersion). None when rentals
        get their own cgroup, else the reason they do not."""
        self.driver = cgroup_driver
        why_not = self.slices.unavailable() if cgroup_driver == "systemd" else None
        if cgroup_driver not in ("cgroupfs", "systemd"):
            self.version = None
            self.unavailable = (
                f"dockerd uses the {cgroup_driver or 'unknown'} cgroup driver: per-rental limits need cgroupfs "
                "or systemd; each container still has the rental's limits"
            )
        elif why_not:
            self.version = None
            self.unavailable = (
                f"dockerd uses the systemd cgroup driver, and {why_not}: each container still has the rental's limits"
            )
        elif cgroup_version == "2" and (self.root / "cgroup.controllers").exists():
            self.version, self.unavailable = "2", ""
        elif cgroup_version in ("1", "") and (self.root / "memory").is_dir():
            self.version, self.unavailable = "1", ""
        else:
            self.version = None
            self.unavailable = f"cgroup v{cgroup_version} is not mounted at {self.root} as dockerd sees it"
        return self.unavailable or None

    def parent_of(self, rental_id: str) -> str | None:
        """The `cgroup_parent` of the rental's containers, None when not available."""
        if self.version is None:
            return None
        if not _SAFE_ID.fullmatch(rental_id):  # match's $ takes a trailing newline
            raise CgroupError(f"rental id {rental_id[:40]!r} cannot name a cgroup")
        return slice_name(rental_id) if self.driver == "systemd" else f"/{TOP}/r-{rental_id}"

    def _relative(self, parent: str) -> str:
        """The rental's cgroup below a hierarchy's root."""
        return cgroup_path(parent) if self.driver == "systemd" else parent.lstrip("/")

    def apply(self, rental_id: str, limits: RentalLimits) -> None:
        """Create the rental's cgroup (idempotent) and write its limits. Blocking: call off the loop."""
        parent = self.parent_of(rental_id)
        if parent is None:
            return
        if self.driver == "systemd":
            try:
                self.slices.apply(parent, limits, self.version or "")
            except (SliceError, OSError, subprocess.SubprocessError) as exc:
                raise CgroupError(f"the rental's slice {parent} could not be limited: {exc}") from None
            return
        try:
            if self.version == "2":
                self._apply_v2(parent, limits)
            else:
                self._apply_v1(parent, limits)
        except OSError as exc:
            raise CgroupError(f"the rental's cgroup {parent} could not be limited: {exc.strerror or exc}") from None

    def remove(self, rental_id: str) -> bool:
        """Remove the rental's cgroup once its containers are gone; False when
        something still runs in it (it is tried again at the rental's next end)."""
        parent = self.parent_of(rental_id)
        if parent is None:
            return True
        if self.driver == "systemd":
            return self._stop_slice(parent)
        folders = [self.root / self._relative(parent)] if self.version == "2" else self._v1_folders(parent)
        removed = True
        for folder in folders:
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                removed = False
                log.warning("rental_cgroup_not_removed", path=str(folder), error=exc.strerror)
        return removed

    def memory_limit_reached(self, rental_id: str) -> bool:
        """Whether the rental's containers together reached the rental's
        memory limit since the last call: what tells an OOM kill at the
        rental's limit from one at a container's own. (v1 keeps a high-water
        mark, compared with the limit and then reset; v2 counts, in
        `memory.events.local`, the times the rental's own limit was met. The
        kernel's failure counters are no help: on this machine's v1 they stay
        0 when an ancestor's limit is what failed.)"""
        parent = self.parent_of(rental_id)
        if parent is None:
            return False
        if self.version == "2":
            count = _counter(self.root / self._relative(parent) / "memory.events.local", r"^max (\d+)$")
            reached = count > self._limit_events.get(rental_id, 0)
            self._limit_events[rental_id] = count
            return reached
        folder = self.root / "memory" / self._relative(parent)
        peak, limit = _counter(folder / "memory.max_usage_in_bytes"), _counter(folder / "memory.limit_in_bytes")
        try:
            (folder / "memory.max_usage_in_bytes").write_text("0\n")  # from now on, the mark starts again
        except OSError:
            pass
        return bool(limit) and peak >= limit - LIMIT_SLACK_BYTES

    def _stop_slice(self, name: str) -> bool:
        """Stop the slice once no container's scope is left in it: stopping
        it would kill what still runs there."""
        hierarchy = self.root if self.version == "2" else self.root / "memory"
        folder = hierarchy / self._relative(name)
        try:
            left = [entry.name for entry in folder.iterdir() if entry.is_dir()]
        except OSError:
            left = []
        if left:
            log.warning("rental_slice_not_stopped", slice=name, still_there=left[:3])
            return False
        try:
            return self.slices.stop(name)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("rental_slice_not_stopped", slice=name, error=str(exc))
            return False

    # ---- v1: a directory per controller ------------------------------------------
    def _v1_folders(self, parent: str) -> list[Path]:
        """The rental's directory in every mounted hierarchy (runc makes it in each)."""
        return [entry / parent.lstrip("/") for entry in sorted(self.root.iterdir()) if entry.is_dir()]

    def _apply_v1(self, parent: str, limits: RentalLimits) -> None:
        path = parent.lstrip("/")
        for controller in V1_LIMITED:
            (self.root / controller / path).mkdir(parents=True, exist_ok=True)
        memory = self.root / "memory" / path
        swap = memory / "memory.memsw.limit_in_bytes"  # absent when the kernel has no swap accounting
        try:
            _write(memory / "memory.limit_in_bytes", limits.memory_bytes)
            if swap.exists():
                _write(swap, limits.memory_bytes)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            _write(swap, limits.memory_bytes)  # raising: memory+swap must grow first
            _write(memory / "memory.limit_in_bytes", limits.memory_bytes)
        cpu = self.root / "cpu" / path
        _write(cpu / "cpu.cfs_period_us", CPU_PERIOD_US)
        _write(cpu / "cpu.cfs_quota_us", max(1000, int(limits.cpus * CPU_PERIOD_US)))
        _write(self.root / "pids" / path / "pids.max", limits.pids)

    # ---- v2: one tree ------------------------------------------------------------
    def _apply_v2(self, parent: str, limits: RentalLimits) -> None:
        top = self.root / TOP
        folder = self.root / parent.lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        for holder in (self.root, top, folder):  # the controllers reach the containers below
            _write(holder / "cgroup.subtree_control", "+memory +cpu +pids")
        _write(folder / "memory.max", limits.memory_bytes)
        if (folder / "memory.swap.max").exists():
            _write(folder / "memory.swap.max", 0)
        _write(folder / "cpu.max", f"{max(1000, int(limits.cpus * CPU_PERIOD_US))} {CPU_PERIOD_US}")
        _write(folder / "pids.max", limits.pids)


def _counter(path: Path, pattern: str = r"^(\d+)$") -> int:
    """A number in a kernel file, 0 when the file or the number is not there."""
    try:
        text = path.read_text()
    except OSError:
        return 0
    match = re.search(pattern, text.strip(), re.MULTILINE)
    return int(match.group(1)) if match else 0


def _write(path: Path, value: object) -> None:
    path.write_text(f"{value}\n")

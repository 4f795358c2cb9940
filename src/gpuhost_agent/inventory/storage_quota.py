"""Whether Docker's disk can hold each container's writable layer to a size.

Docker's overlay2 driver takes `storage_opt: {size: ...}` only on XFS mounted
with project quotas (`pquota`, shown by the kernel as `prjquota`); anywhere
else the container is refused at creation. Its btrfs driver (which runs only
with its data root on btrfs) takes it always: the size is a qgroup limit on
the container's subvolume, and dockerd turns the file system's quotas on
itself (seen on the modern host, docs/hosts.md). So the agent asks for that
quota only where `docker info` and the mount table both say it will hold, and
measures the rental's disk use on a schedule everywhere (core/disk_watch.py).
Pure: `docker info` and /proc/self/mountinfo's text in, the verdict out.
"""

from __future__ import annotations

import os
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
QUOTA_OPTIONS = frozenset({"prjquota", "pquota"})  # pqnoenforce counts but does not limit


def storage_quota(info: dict, mountinfo: str) -> dict:
    """{"available": bool, "detail": why}, from `docker info` and the mount table."""
    driver = info.get("Driver") or "unknown"
    if driver == "btrfs":
        root = str(info.get("DockerRootDir") or "/var/lib/docker")
        return _verdict(True, f"btrfs with quota groups at {mount_of(root, mountinfo)[0]}")
    if driver != "overlay2":
        return _verdict(False, f"the {driver} storage driver: the rental's disk use is measured, not capped")
    status = {str(pair[0]): str(pair[1]) for pair in info.get("DriverStatus") or [] if len(pair) == 2}
    backing = status.get("Backing Filesystem", "unknown")
    if backing != "xfs":
        return _verdict(False, f"overlay2 on {backing}: a size per container needs XFS with project quotas")
    root = str(info.get("DockerRootDir") or "/var/lib/docker")
    mount_point, options = mount_of(root, mountinfo)
    if not options & QUOTA_OPTIONS:
        return _verdict(False, f"XFS at {mount_point} is mounted without pquota: add it to the mount's options")
    return _verdict(True, f"overlay2 on XFS with project quotas at {mount_point}")


def mount_of(path: str, mountinfo: str) -> tuple[str, set[str]]:
    """The mount holding `path` (the longest mount point above it, the last
    one mounted there) and its mount and superblock options together."""
    best, options = "", set()
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 10 or "-" not in fields:
            continue
        mount_point = fields[4].replace("\\040", " ")
        if not _under(path, mount_point) or len(mount_point) < len(best):
            continue
        separator = fields.index("-")
        best = mount_point
        options = set(fields[5].split(",")) | set(fields[separator + 3].split(","))
    return best or "/", options


def read_mountinfo() -> str:
    try:
        return MOUNTINFO.read_text()
    except OSError:
        return ""


def _under(path: str, mount_point: str) -> bool:
    return mount_point == "/" or path == mount_point or path.startswith(mount_point.rstrip(os.sep) + os.sep)


def _verdict(available: bool, detail: str) -> dict:
    return {"available": available, "detail": detail}

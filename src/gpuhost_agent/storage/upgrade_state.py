"""The agent's upgrade record, `upgrade.json` in its state directory: which
installed version runs, the one on trial, the versions that failed here, and
the last attempt (for the marketplace).

Three processes write it, one at a time under `upgrade.lock`: the launcher
(`gpuhost-agent run` as systemd starts it, before it becomes the chosen
version), the guardian it leaves for a version on trial, and the running
agent (an upgrade installed, a trial confirmed). A write is a new file renamed
over the old one after fsync, so a crash or power loss leaves the old record
or the new, never half of one (common/json_files.py, and the folder fsync'd).
Only the standard library besides: the launcher reads it before anything of
the agent is loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict, cast

from gpuhost_agent.common.json_files import write_json_atomically

FILE, LOCK = "upgrade.json", "upgrade.lock"
VERSIONS = "versions"  # <state dir>/versions/<version>-<sha256[:12]>/: a virtual environment each


class InstalledVersion(TypedDict):
    """An installed version: its number and its folder (`prefix`)."""

    version: str
    prefix: str


# The version on trial: where it is installed, what it replaces (`from`, a
# Python keyword: hence the functional form), how often it was started,
# its health bound, and what it still lacked (`waiting`) or why it failed.
Trial = TypedDict(
    "Trial",
    {
        "version": str,
        "sha256": str,
        "prefix": str,
        "from": str | None,
        "starts": int,
        "healthSeconds": float,
        "failure": str | None,
        "waiting": str,
    },
    total=False,
)


class Failure(TypedDict, total=False):
    """A version that failed here: kept so that it is not tried again and again."""

    version: str
    sha256: str
    reason: str
    at: str
    outage: bool  # the marketplace was away during its trial: it may be offered again


# The last attempt, for the marketplace (AgentInfo.upgrade.lastAttempt).
Attempt = TypedDict(
    "Attempt", {"version": str, "outcome": str, "reason": str, "at": str, "from": str | None}, total=False
)


class UpgradeRecord(TypedDict):
    """The record: every key there (load fills in what the file lacks)."""

    current: InstalledVersion | None
    trial: Trial | None
    failed: list[Failure]
    lastAttempt: Attempt | None
    restarts: list[str]
    keys: object  # core/release_keys.py's record, checked where it is read


def empty() -> UpgradeRecord:
    """`keys`: the release keys the host moved to since its pin (core/release_keys.py)."""
    return {"current": None, "trial": None, "failed": [], "lastAttempt": None, "restarts": [], "keys": None}


def load(state_dir: Path) -> UpgradeRecord:
    """The record; an empty one when there is none or it cannot be read (the
    installed version then runs: the safe choice)."""
    try:
        record = json.loads((state_dir / FILE).read_text())
    except (OSError, ValueError):
        return empty()
    if not isinstance(record, dict):
        return empty()
    return cast(UpgradeRecord, {**empty(), **{key: record[key] for key in empty() if key in record}})


def save(state_dir: Path, record: UpgradeRecord) -> None:
    write_json_atomically(state_dir / FILE, record)
    # The rename itself made durable: a power loss right after a trial was
    # written must not bring back the record without it.
    folder = os.open(state_dir, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Held while a process reads, decides and writes the record."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(state_dir / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

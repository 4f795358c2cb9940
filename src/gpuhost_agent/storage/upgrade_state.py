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

from gpuhost_agent.common.json_files import write_json_atomically

FILE, LOCK = "upgrade.json", "upgrade.lock"
VERSIONS = "versions"  # <state dir>/versions/<version>-<sha256[:12]>/: a virtual environment each


def empty() -> dict:
    """`keys`: the release keys the host moved to since its pin (core/release_keys.py)."""
    return {"current": None, "trial": None, "failed": [], "lastAttempt": None, "restarts": [], "keys": None}


def load(state_dir: Path) -> dict:
    """The record; an empty one when there is none or it cannot be read (the
    installed version then runs: the safe choice)."""
    try:
        record = json.loads((state_dir / FILE).read_text())
    except (OSError, ValueError):
        return empty()
    if not isinstance(record, dict):
        return empty()
    return {**empty(), **{key: record[key] for key in empty() if key in record}}


def save(state_dir: Path, record: dict) -> None:
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

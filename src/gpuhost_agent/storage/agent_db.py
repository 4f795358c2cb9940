"""The agent's durable record, one SQLite file in the state directory.

What must survive a crash lives here: the jobs received and how they ended,
the stacks and rentals on this machine with their GPU assignments and end
dates, and the reports the marketplace has not acknowledged yet. SQLite gives
atomic, fsync'd transactions (WAL, synchronous=FULL), so a kill -9 or a power
cut leaves the last committed state, never half of a write.

A file that is corrupt or unreadable is moved aside and a new one started,
with a warning: the agent then rebuilds what it can from Docker's labels and
the marketplace's desired state (see core.reconciler) instead of crash-looping
under systemd.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict, cast

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.protocol import wire_jobs, wire_time

log = get_logger(__name__)

DB_FILE = "agent.db"
REMEMBERED_JOBS = 4096
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, type TEXT NOT NULL, stack_id TEXT NOT NULL, rental_id TEXT NOT NULL,
    state TEXT NOT NULL, received_at TEXT NOT NULL, completion TEXT, finished_seq INTEGER);
CREATE TABLE IF NOT EXISTS stacks (
    stack_id TEXT PRIMARY KEY, rental_id TEXT NOT NULL, env_id TEXT NOT NULL, project TEXT NOT NULL,
    status TEXT NOT NULL, error_msg TEXT NOT NULL DEFAULT '', updated_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rentals (
    rental_id TEXT PRIMARY KEY, end_date TEXT, gpus TEXT NOT NULL DEFAULT '[]', ended_at TEXT);
CREATE TABLE IF NOT EXISTS outbox (
    kind TEXT NOT NULL, target TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (kind, target));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS usage (
    rental_id TEXT NOT NULL, gpu_uuid TEXT NOT NULL, slot_start INTEGER NOT NULL,
    seconds REAL NOT NULL DEFAULT 0, busy REAL NOT NULL DEFAULT 0, lost REAL NOT NULL DEFAULT 0,
    offline REAL NOT NULL DEFAULT 0, PRIMARY KEY (rental_id, gpu_uuid, slot_start));
"""
JOB_RUNNING, JOB_FINISHED, JOB_INTERRUPTED = "running", "finished", "interrupted"


class StackRow(TypedDict, total=False):
    """A row of the stacks table: the agent's record of a stack it runs.
    Every column is there (total=False lets a reader's `.get(id) or {}` read
    a stack the table lacks as an empty row)."""

    stack_id: str
    rental_id: str
    env_id: str
    project: str  # its Compose project (a Swarm stack's namespace)
    status: str  # as last reported: APPLYING, APPLIED, ERROR, REMOVING
    error_msg: str
    updated_at: str


class RentalRow(TypedDict, total=False):
    """A row of the rentals table, its GPUs decoded (every column is there,
    as in StackRow)."""

    rental_id: str
    end_date: str | None
    gpus: list[str]
    ended_at: str | None


class AgentDB:
    def __init__(self, path: Path | None):
        """path None: a private in-memory database (unit tests, tools)."""
        self.path = path
        self.rebuilt_because: str | None = None  # why the file was started afresh, if it was
        if path is None:
            self._conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            self._conn.executescript(_SCHEMA)
            self.interrupted: list[dict] = []
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        existed = path.exists()
        try:
            self._conn = self._open(path)
        except sqlite3.DatabaseError as exc:
            self._move_aside(path, str(exc))
            self._conn = self._open(path)
        if not existed and self.rebuilt_because is None:
            self.rebuilt_because = "no state file yet"
        self.interrupted = self._mark_interrupted()

    def _open(self, path: Path) -> sqlite3.Connection:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))  # never readable by others, not even briefly
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            path.chmod(0o600)
            problem = conn.execute("PRAGMA quick_check").fetchone()[0]
            if problem != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {problem}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(_SCHEMA)
        except sqlite3.DatabaseError:
            conn.close()
            raise
        return conn

    def _move_aside(self, path: Path, why: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S") + f"-{time.time_ns() % 1_000_000_000:09d}"
        for suffix in ("", "-wal", "-shm"):
            part = Path(f"{path}{suffix}")
            if part.exists():
                part.rename(f"{path}.corrupt-{stamp}{suffix}")
        self.rebuilt_because = f"state file was unreadable ({why}); kept as {path.name}.corrupt-{stamp}"
        log.warning(
            "state_file_rebuilt",
            path=str(path),
            error=why,
            hint="rebuilding from Docker's labels and the marketplace",
        )

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Everything written inside commits together or not at all: a usage
        figure and the report that carries it (a crash between the two would
        count the seconds again, or never send them)."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _write(self, sql: str, *args: Any) -> None:
        self._conn.execute(sql, args)

    def _rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        cursor = self._conn.execute(sql, args)
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    # ---- jobs ----------------------------------------------------------------
    def _mark_interrupted(self) -> list[dict]:
        """Jobs a previous process started and never finished: the marketplace
        hands them out again (and reconcile checks their stacks)."""
        rows = self._rows("SELECT job_id, type, stack_id, rental_id FROM jobs WHERE state = ?", JOB_RUNNING)
        self._write("UPDATE jobs SET state = ? WHERE state = ?", JOB_INTERRUPTED, JOB_RUNNING)
        return rows

    def job_started(self, job: wire_jobs.StackJob) -> None:
        self._write(
            "INSERT INTO jobs (job_id, type, stack_id, rental_id, state, received_at) VALUES (?,?,?,?,?,?)"
            " ON CONFLICT(job_id) DO UPDATE SET state = excluded.state",
            job.job_id,
            job.type,
            job.stack_id,
            job.rental_id,
            JOB_RUNNING,
            wire_time.iso(),
        )

    def job_finished(self, job_id: str, completion: dict) -> None:
        """Kept (the newest REMEMBERED_JOBS) so that a redelivered job gets its
        completion again instead of a second run."""
        seq = self._next("job_seq")
        self._write(
            "INSERT INTO jobs (job_id, type, stack_id, rental_id, state, received_at, completion, finished_seq)"
            " VALUES (?, '', '', '', ?, ?, ?, ?) ON CONFLICT(job_id) DO UPDATE SET state = excluded.state,"
            " completion = excluded.completion, finished_seq = excluded.finished_seq",
            job_id,
            JOB_FINISHED,
            wire_time.iso(),
            json.dumps(completion),
            seq,
        )
        self._write("DELETE FROM jobs WHERE state = ? AND finished_seq <= ?", JOB_FINISHED, seq - REMEMBERED_JOBS)

    def completion(self, job_id: str) -> dict | None:
        rows = self._rows("SELECT completion FROM jobs WHERE job_id = ? AND state = ?", job_id, JOB_FINISHED)
        return json.loads(rows[0]["completion"]) if rows else None

    # ---- stacks ----------------------------------------------------------------
    def stack_status(
        self, stack_id: str, rental_id: str, env_id: str, project: str, status: str, error_msg: str = ""
    ) -> None:
        self._write(
            "INSERT INTO stacks VALUES (?,?,?,?,?,?,?) ON CONFLICT(stack_id) DO UPDATE SET"
            " status = excluded.status, error_msg = excluded.error_msg, updated_at = excluded.updated_at,"
            " project = excluded.project",
            stack_id,
            rental_id,
            env_id,
            project,
            status,
            error_msg,
            wire_time.iso(),
        )

    def forget_stack(self, stack_id: str) -> None:
        self._write("DELETE FROM stacks WHERE stack_id = ?", stack_id)

    def stack_rental(self, stack_id: str) -> str | None:
        """The rental a stack on this host belongs to, None when the host has no such stack."""
        rows = self._rows("SELECT rental_id FROM stacks WHERE stack_id = ?", stack_id)
        return str(rows[0]["rental_id"]) if rows else None

    def stacks(self) -> dict[str, StackRow]:
        return {row["stack_id"]: cast(StackRow, row) for row in self._rows("SELECT * FROM stacks")}

    # ---- rentals ---------------------------------------------------------------
    def rental_end_date(self, rental_id: str, end_date: str | None) -> bool:
        """Record when the rental ends; True when that changed what was known."""
        rows = self._rows("SELECT end_date FROM rentals WHERE rental_id = ?", rental_id)
        if rows and rows[0]["end_date"] == end_date:
            return False
        self._write(
            "INSERT INTO rentals (rental_id, end_date) VALUES (?, ?)"
            " ON CONFLICT(rental_id) DO UPDATE SET end_date = excluded.end_date",
            rental_id,
            end_date,
        )
        return True

    def rental_gpus(self, rental_id: str, uuids: list[str]) -> None:
        self._write(
            "INSERT INTO rentals (rental_id, gpus) VALUES (?, ?)"
            " ON CONFLICT(rental_id) DO UPDATE SET gpus = excluded.gpus",
            rental_id,
            json.dumps(uuids),
        )

    def rental_ended(self, rental_id: str) -> None:
        self._write(
            "INSERT INTO rentals (rental_id, gpus, ended_at) VALUES (?, '[]', ?)"
            " ON CONFLICT(rental_id) DO UPDATE SET gpus = '[]', ended_at = excluded.ended_at",
            rental_id,
            wire_time.iso(),
        )

    def forget_rentals_ended_before(self, moment: str) -> list[str]:
        """Drop the rows of rentals that ended before `moment` (ISO, UTC, as
        wire_time.iso writes it, so the text order is the time order); their ids."""
        rows = self._rows("SELECT rental_id FROM rentals WHERE ended_at IS NOT NULL AND ended_at < ?", moment)
        self._write("DELETE FROM rentals WHERE ended_at IS NOT NULL AND ended_at < ?", moment)
        return [row["rental_id"] for row in rows]

    def rentals(self) -> dict[str, RentalRow]:
        rows = self._rows("SELECT * FROM rentals")
        return {row["rental_id"]: cast(RentalRow, {**row, "gpus": json.loads(row["gpus"])}) for row in rows}

    # ---- outbox ----------------------------------------------------------------
    def outbox_put(self, kind: str, target: str, seq: int, body: dict) -> None:
        """A newer report of the same kind for the same target replaces the old
        one but keeps its place (seq) in the queue."""
        self._write(
            "INSERT INTO outbox VALUES (?,?,?,?) ON CONFLICT(kind, target) DO UPDATE SET body = excluded.body",
            kind,
            target,
            seq,
            json.dumps(body),
        )

    def outbox_delete(self, kind: str, target: str) -> None:
        self._write("DELETE FROM outbox WHERE kind = ? AND target = ?", kind, target)

    def outbox_entries(self) -> list[tuple[str, str, int, dict]]:
        rows = self._rows("SELECT kind, target, seq, body FROM outbox ORDER BY seq")
        return [(row["kind"], row["target"], row["seq"], json.loads(row["body"])) for row in rows]

    # ---- GPU usage (core.usage_meter) ---------------------------------------------
    def usage_add(self, rental_id: str, uuid: str, slot_start: int, figures: tuple[float, float, float, float]) -> None:
        """Add seconds (used, busy, lost, offline) to a GPU's slot."""
        self._write(
            "INSERT INTO usage VALUES (?,?,?,?,?,?,?) ON CONFLICT(rental_id, gpu_uuid, slot_start) DO UPDATE SET"
            " seconds = seconds + excluded.seconds, busy = busy + excluded.busy,"
            " lost = lost + excluded.lost, offline = offline + excluded.offline",
            rental_id,
            uuid,
            slot_start,
            *figures,
        )

    def usage_slot(self, rental_id: str, slot_start: int) -> list[dict]:
        """A rental's totals in one slot, one row per GPU."""
        return self._rows(
            "SELECT gpu_uuid, seconds, busy, lost, offline FROM usage"
            " WHERE rental_id = ? AND slot_start = ? ORDER BY gpu_uuid",
            rental_id,
            slot_start,
        )

    def usage_prune(self, before: int) -> None:
        """Slots before `before` are final and their reports queued: forget them."""
        self._write("DELETE FROM usage WHERE slot_start < ?", before)

    # ---- counters and small values ---------------------------------------------
    def meta(self, key: str, default: str | None = None) -> str | None:
        rows = self._rows("SELECT value FROM meta WHERE key = ?", key)
        return rows[0]["value"] if rows else default

    def set_meta(self, key: str, value: str) -> None:
        self._write("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value", key, value)

    def _next(self, counter: str) -> int:
        value = int(self.meta(counter) or "0") + 1
        self.set_meta(counter, str(value))
        return value

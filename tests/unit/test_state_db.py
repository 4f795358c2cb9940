"""AgentDB: the agent's durable record (jobs, stacks, rentals, outbox, meta),
what survives a close and reopen, and what happens to a corrupt or missing file.

No Docker, no network: each test opens its own SQLite file under tmp_path.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from gpuhost_agent.protocol import wire, wire_jobs, wire_time
from gpuhost_agent.storage import agent_db as state_db
from gpuhost_agent.storage.agent_db import DB_FILE, AgentDB

TEMPLATE = {"name": "n", "description": "d", "content": "services: {}\n", "environmentVariables": {}}
CORRUPT_NAME = re.compile(r"^agent\.db\.corrupt-\d{8}T\d{6}-\d{9}$")


def job(job_id: str, stack_id: str = "s1", rental_id: str = "r1") -> wire_jobs.StackJob:
    return wire_jobs.StackJob(
        job_id, wire.JOB_DEPLOY, stack_id, rental_id, "env1", "web", wire_jobs.validate_template(TEMPLATE)
    )


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "state" / DB_FILE


def reopen(db: AgentDB) -> AgentDB:
    db.close()
    return AgentDB(db.path)


def corrupt_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if CORRUPT_NAME.match(p.name))


def job_state(db: AgentDB, job_id: str) -> str | None:
    rows = db._rows("SELECT state FROM jobs WHERE job_id = ?", job_id)
    return rows[0]["state"] if rows else None


# ---- the file itself -----------------------------------------------------------


def test_state_file_is_private_even_with_a_permissive_umask(db_path):
    old = os.umask(0)
    try:
        db = AgentDB(db_path)
        db.stack_status("s1", "r1", "env1", "p", wire.APPLIED)
    finally:
        os.umask(old)
    try:
        assert db_path.exists()
        assert stat.S_IMODE(db_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(db_path.parent.stat().st_mode) == 0o700
        for suffix in ("-wal", "-shm"):  # SQLite gives these the main file's mode
            side = Path(f"{db_path}{suffix}")
            if side.exists():
                assert stat.S_IMODE(side.stat().st_mode) == 0o600, side
    finally:
        db.close()


def test_an_existing_state_file_is_made_private_on_open(db_path):
    AgentDB(db_path).close()
    db_path.chmod(0o644)
    db = AgentDB(db_path)
    try:
        assert stat.S_IMODE(db_path.stat().st_mode) == 0o600
    finally:
        db.close()


def test_missing_file_is_started_with_a_reason_and_a_healthy_reopen_has_none(db_path):
    assert not db_path.exists()
    db = AgentDB(db_path)
    assert db.rebuilt_because == "no state file yet"
    assert db.interrupted == []
    db = reopen(db)
    try:
        assert db.rebuilt_because is None
        assert corrupt_files(db_path.parent) == []
    finally:
        db.close()


def test_in_memory_database_works():
    db = AgentDB(None)
    try:
        assert db.path is None and db.rebuilt_because is None and db.interrupted == []
        db.job_started(job("j1"))
        db.job_finished("j1", {"outcome": "succeeded"})
        assert db.completion("j1") == {"outcome": "succeeded"}
        db.stack_status("s1", "r1", "env1", "p", wire.APPLIED)
        assert set(db.stacks()) == {"s1"}
        db.rental_gpus("r1", ["GPU-1"])
        assert db.rentals()["r1"]["gpus"] == ["GPU-1"]
        db.outbox_put("status", "s1", 1, {"status": "APPLIED"})
        assert db.outbox_entries() == [("status", "s1", 1, {"status": "APPLIED"})]
        db.set_meta("k", "v")
        assert db.meta("k") == "v"
    finally:
        db.close()


def test_two_in_memory_databases_are_separate():
    first, second = AgentDB(None), AgentDB(None)
    try:
        first.set_meta("k", "1")
        assert second.meta("k") is None
    finally:
        first.close()
        second.close()


# ---- corrupt files -------------------------------------------------------------


def test_garbage_file_is_kept_aside_and_a_new_one_started(db_path):
    db_path.parent.mkdir(parents=True)
    garbage = b"this is not an SQLite database at all \x00\xff" * 100
    db_path.write_bytes(garbage)
    db = AgentDB(db_path)  # must not raise
    try:
        assert db.rebuilt_because is not None
        assert db.rebuilt_because.startswith("state file was unreadable (")
        kept = corrupt_files(db_path.parent)
        assert len(kept) == 1
        assert kept[0].read_bytes() == garbage
        assert kept[0].name in db.rebuilt_because
        assert db.interrupted == []
        # the new file works and is a real SQLite database
        assert db_path.read_bytes()[:16] != garbage[:16]
        db.stack_status("s1", "r1", "env1", "p", wire.APPLIED)
        db = reopen(db)
        assert db.rebuilt_because is None
        assert db.stacks()["s1"]["status"] == wire.APPLIED
        assert len(corrupt_files(db_path.parent)) == 1
    finally:
        db.close()


def test_truncated_sqlite_file_is_kept_aside_and_a_new_one_started(db_path):
    db = AgentDB(db_path)
    for i in range(200):
        db.stack_status(f"s{i}", "r1", "env1", "p" * 200, wire.APPLIED)
        db.outbox_put("status", f"s{i}", i, {"status": "APPLIED", "pad": "x" * 300})
    db.close()
    assert not Path(f"{db_path}-wal").exists()  # everything is in the main file now
    assert db_path.read_bytes()[:16] == b"SQLite format 3\x00"
    size = db_path.stat().st_size
    assert size > 16 * 4096  # many pages, so that half of it is really missing
    with open(db_path, "r+b") as handle:
        handle.truncate(size // 2)

    db = AgentDB(db_path)  # must not raise
    try:
        assert db.rebuilt_because is not None and "unreadable" in db.rebuilt_because
        kept = corrupt_files(db_path.parent)
        assert len(kept) == 1 and kept[0].stat().st_size == size // 2
        assert kept[0].name in db.rebuilt_because
        assert db.stacks() == {} and db.outbox_entries() == []
        db.stack_status("new", "r2", "env1", "p", wire.APPLYING)
        db = reopen(db)
        assert db.rebuilt_because is None
        assert list(db.stacks()) == ["new"]
    finally:
        db.close()


# ---- jobs ----------------------------------------------------------------------


def test_unfinished_job_is_reported_interrupted_once_after_reopen(db_path):
    db = AgentDB(db_path)
    db.job_started(job("j1", "s1", "r1"))
    db.job_started(job("j2", "s2", "r2"))
    db.job_finished("j2", {"outcome": "succeeded"})
    assert job_state(db, "j1") == state_db.JOB_RUNNING
    db = reopen(db)
    try:
        assert db.interrupted == [{"job_id": "j1", "type": wire.JOB_DEPLOY, "stack_id": "s1", "rental_id": "r1"}]
        assert job_state(db, "j1") == state_db.JOB_INTERRUPTED
        assert job_state(db, "j2") == state_db.JOB_FINISHED
        assert db.completion("j1") is None  # interrupted is not finished
        db = reopen(db)
        assert db.interrupted == []  # no longer running, so not listed again
        assert job_state(db, "j1") == state_db.JOB_INTERRUPTED
    finally:
        db.close()


def test_redelivered_interrupted_job_is_running_again(db_path):
    db = AgentDB(db_path)
    db.job_started(job("j1"))
    db = reopen(db)
    db.job_started(job("j1"))  # delivered again
    assert job_state(db, "j1") == state_db.JOB_RUNNING
    db = reopen(db)
    try:
        assert [row["job_id"] for row in db.interrupted] == ["j1"]
    finally:
        db.close()


def test_completion_survives_reopen_and_is_replaced(db_path):
    db = AgentDB(db_path)
    assert db.completion("j1") is None
    db.job_started(job("j1"))
    assert db.completion("j1") is None  # running: no completion yet
    db.job_finished("j1", {"outcome": "failed", "errorMsg": "boom"})
    db = reopen(db)
    try:
        assert db.interrupted == []
        assert db.completion("j1") == {"outcome": "failed", "errorMsg": "boom"}
        assert db.completion("other") is None
        db.job_finished("j1", {"outcome": "succeeded"})
        assert db.completion("j1") == {"outcome": "succeeded"}
        # a job finished without having been started here (e.g. refused) is kept too
        db.job_finished("j9", {"outcome": "failed"})
        db = reopen(db)
        assert db.completion("j9") == {"outcome": "failed"}
        assert db.completion("j1") == {"outcome": "succeeded"}
    finally:
        db.close()


def test_only_the_newest_completions_are_remembered(db_path, monkeypatch):
    monkeypatch.setattr(state_db, "REMEMBERED_JOBS", 3)
    db = AgentDB(db_path)
    db.job_started(job("running"))
    for i in range(1, 6):
        db.job_finished(f"j{i}", {"n": i})
    assert [db.completion(f"j{i}") for i in range(1, 6)] == [None, None, {"n": 3}, {"n": 4}, {"n": 5}]
    db = reopen(db)
    try:
        assert [db.completion(f"j{i}") for i in range(1, 6)] == [None, None, {"n": 3}, {"n": 4}, {"n": 5}]
        # the bound applies to finished jobs only: the unfinished one is still known
        assert [row["job_id"] for row in db.interrupted] == ["running"]
        db.job_finished("j6", {"n": 6})  # the counter goes on after a reopen
        assert db.completion("j3") is None
        assert [db.completion(f"j{i}") for i in (4, 5, 6)] == [{"n": 4}, {"n": 5}, {"n": 6}]
    finally:
        db.close()


# ---- stacks --------------------------------------------------------------------


def test_stacks_are_recorded_updated_and_forgotten(db_path):
    db = AgentDB(db_path)
    assert db.stacks() == {}
    db.stack_status("s1", "r1", "env1", "p1", wire.APPLYING)
    db.stack_status("s2", "r2", "env1", "p2", wire.APPLIED)
    db.stack_status("s1", "r1", "env1", "p1b", wire.ERROR, "compose failed")
    db = reopen(db)
    try:
        stacks = db.stacks()
        assert set(stacks) == {"s1", "s2"}
        s1 = stacks["s1"]
        assert (s1["rental_id"], s1["env_id"], s1["project"], s1["status"], s1["error_msg"]) == (
            "r1",
            "env1",
            "p1b",
            wire.ERROR,
            "compose failed",
        )
        assert wire_time.is_iso(s1["updated_at"])
        assert stacks["s2"]["status"] == wire.APPLIED and stacks["s2"]["error_msg"] == ""
        db.stack_status("s1", "r1", "env1", "p1b", wire.APPLIED)  # error cleared
        assert db.stacks()["s1"]["error_msg"] == ""
        db.forget_stack("s2")
        db.forget_stack("never-known")  # no error
        db = reopen(db)
        assert list(db.stacks()) == ["s1"]
    finally:
        db.close()


# ---- rentals -------------------------------------------------------------------


def test_rental_end_date_reports_only_changes(db_path):
    db = AgentDB(db_path)
    assert db.rental_end_date("r1", "2030-01-01T00:00:00Z") is True
    assert db.rental_end_date("r1", "2030-01-01T00:00:00Z") is False
    db = reopen(db)
    try:
        assert db.rental_end_date("r1", "2030-01-01T00:00:00Z") is False  # still known after reopen
        assert db.rental_end_date("r1", "2031-01-01T00:00:00Z") is True
        assert db.rentals()["r1"]["end_date"] == "2031-01-01T00:00:00Z"
        assert db.rental_end_date("r1", None) is True  # end date withdrawn
        assert db.rental_end_date("r1", None) is False
        assert db.rentals()["r1"]["end_date"] is None
    finally:
        db.close()


def test_rental_gpus_and_end(db_path):
    db = AgentDB(db_path)
    db.rental_end_date("r1", "2030-01-01T00:00:00Z")
    db.rental_gpus("r1", ["GPU-1", "GPU-2"])
    db.rental_gpus("r2", ["GPU-3"])
    db = reopen(db)
    try:
        rentals = db.rentals()
        assert rentals["r1"] == {
            "rental_id": "r1",
            "end_date": "2030-01-01T00:00:00Z",
            "gpus": ["GPU-1", "GPU-2"],
            "ended_at": None,
        }
        assert rentals["r2"]["gpus"] == ["GPU-3"] and rentals["r2"]["end_date"] is None
        # a new end date keeps the GPUs
        assert db.rental_end_date("r1", "2030-06-01T00:00:00Z") is True
        assert db.rentals()["r1"]["gpus"] == ["GPU-1", "GPU-2"]
        db.rental_ended("r1")
        db.rental_ended("r3")  # never seen before: recorded as ended
        db = reopen(db)
        rentals = db.rentals()
        assert rentals["r1"]["gpus"] == [] and wire_time.is_iso(rentals["r1"]["ended_at"])
        assert rentals["r1"]["end_date"] == "2030-06-01T00:00:00Z"
        assert rentals["r2"]["gpus"] == ["GPU-3"] and rentals["r2"]["ended_at"] is None
        assert rentals["r3"]["gpus"] == [] and wire_time.is_iso(rentals["r3"]["ended_at"])
    finally:
        db.close()


# ---- outbox rows and meta --------------------------------------------------------


def test_outbox_rows_keep_their_seq_when_replaced(db_path):
    db = AgentDB(db_path)
    db.outbox_put("status", "s1", 1, {"status": "APPLYING"})
    db.outbox_put("containers", "s1", 2, {"n": 1})
    db.outbox_put("job", "j1", 3, {"outcome": "succeeded"})
    db.outbox_put("status", "s1", 7, {"status": "APPLIED"})  # replaces, keeps seq 1
    db = reopen(db)
    try:
        assert db.outbox_entries() == [
            ("status", "s1", 1, {"status": "APPLIED"}),
            ("containers", "s1", 2, {"n": 1}),
            ("job", "j1", 3, {"outcome": "succeeded"}),
        ]
        db.outbox_delete("containers", "s1")
        db.outbox_delete("containers", "nothing")  # no error
        db = reopen(db)
        assert [(kind, target, seq) for kind, target, seq, _ in db.outbox_entries()] == [
            ("status", "s1", 1),
            ("job", "j1", 3),
        ]
    finally:
        db.close()


def test_outbox_rows_are_listed_by_seq_not_by_insertion(db_path):
    db = AgentDB(db_path)
    try:
        db.outbox_put("job", "j1", 5, {})
        db.outbox_put("status", "s1", 2, {})
        db.outbox_put("containers", "s1", 9, {})
        assert [seq for _, _, seq, _ in db.outbox_entries()] == [2, 5, 9]
    finally:
        db.close()


def test_meta_values_survive_reopen(db_path):
    db = AgentDB(db_path)
    assert db.meta("reports_dropped") is None
    assert db.meta("reports_dropped", "0") == "0"
    db.set_meta("reports_dropped", "3")
    db.set_meta("reports_dropped", "4")
    db.set_meta("other", "x")
    db = reopen(db)
    try:
        assert db.meta("reports_dropped", "0") == "4"
        assert db.meta("other") == "x"
    finally:
        db.close()

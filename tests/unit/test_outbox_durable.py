"""The outbox on a state database: nothing lost across a crash, order kept,
acknowledged reports deleted, retries with Retry-After, rejections dropped,
and the size bound dropping the least valuable reports first.

No network: the "marketplace" is a send function recording what it gets.
A "crash" is dropping the Outbox object without running it and reopening the
database from its file.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from support.fakes import Recorder, never_called

from gpuhost_agent.protocol.wire import REMOVED
from gpuhost_agent.storage.agent_db import DB_FILE, AgentDB
from gpuhost_agent.uplink.outbox import (
    CONTAINERS,
    DROP_ORDER,
    INIT_STATE,
    JOB_COMPLETE,
    STATUS,
    SYSTEM_DATA,
    USAGE,
    Outbox,
    Report,
)
from gpuhost_agent.uplink.replies import MarketplaceRejected, MarketplaceUnavailable

FAST = dict(base_delay=0.001, max_delay=0.01)


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / DB_FILE


@contextlib.asynccontextmanager
async def running(outbox: Outbox):
    task = asyncio.create_task(outbox.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def keys(db: AgentDB) -> list[tuple[str, str]]:
    return [(kind, target) for kind, target, _, _ in db.outbox_entries()]


# ---- crash and restart -----------------------------------------------------------


async def test_reports_put_before_a_crash_are_sent_after_restart_in_order(db_path):
    db = AgentDB(db_path)
    before = Outbox(never_called, db=db, **FAST)
    before.put(STATUS, "s1", {"status": "APPLYING"})
    before.put(CONTAINERS, "s1", {"n": 1})
    before.put(JOB_COMPLETE, "j1", {"outcome": "succeeded"})
    before.put(STATUS, "s2", {"status": "APPLIED"})
    before.put(SYSTEM_DATA, "env", {"cpu": 1})
    assert before.pending() == 5
    del before  # the process dies: never ran
    db.close()

    db = AgentDB(db_path)
    try:
        sent = Recorder()
        after = Outbox(sent, db=db, **FAST)
        assert after.pending() == 5
        assert after.has(STATUS, "s1") and after.has(JOB_COMPLETE, "j1") and after.has(SYSTEM_DATA, "env")
        assert not await after.drained(0.05)  # restored reports are owed
        async with running(after):
            assert await after.drained(2)
        assert sent.got == [
            (STATUS, "s1", {"status": "APPLYING"}),
            (CONTAINERS, "s1", {"n": 1}),
            (JOB_COMPLETE, "j1", {"outcome": "succeeded"}),
            (STATUS, "s2", {"status": "APPLIED"}),
            (SYSTEM_DATA, "env", {"cpu": 1}),
        ]
        assert after.sent == 5 and after.pending() == 0
    finally:
        db.close()


async def test_reports_are_on_disk_as_soon_as_put_returns(db_path):
    db = AgentDB(db_path)
    outbox = Outbox(never_called, db=db, **FAST)
    outbox.put(STATUS, "s1", {"status": "APPLIED"})
    # another connection, as a restarted process would have, sees it at once
    other = AgentDB(db_path)
    try:
        assert other.outbox_entries() == [(STATUS, "s1", 1, {"status": "APPLIED"})]
    finally:
        other.close()
        db.close()


async def test_a_replaced_report_keeps_its_position_and_only_the_newest_body_is_sent(db_path):
    db = AgentDB(db_path)
    first = Outbox(never_called, db=db, **FAST)
    first.put(STATUS, "s1", {"status": "APPLYING"})
    first.put(CONTAINERS, "s1", {"n": 1})
    first.put(JOB_COMPLETE, "j1", {"outcome": "succeeded"})
    first.put(STATUS, "s1", {"status": "APPLIED"})  # replaces, stays first
    assert first.pending() == 3
    del first
    db.close()

    db = AgentDB(db_path)
    try:
        sent = Recorder()
        outbox = Outbox(sent, db=db, **FAST)
        outbox.put(CONTAINERS, "s1", {"n": 2})  # replaced after the restart: keeps its place too
        outbox.put(STATUS, "s9", {"status": "APPLYING"})  # new: goes last
        assert outbox.pending() == 4
        async with running(outbox):
            assert await outbox.drained(2)
        assert sent.got == [
            (STATUS, "s1", {"status": "APPLIED"}),
            (CONTAINERS, "s1", {"n": 2}),
            (JOB_COMPLETE, "j1", {"outcome": "succeeded"}),
            (STATUS, "s9", {"status": "APPLYING"}),
        ]
    finally:
        db.close()


async def test_a_report_replaced_while_in_flight_is_sent_again_with_the_newest_body(db_path):
    db = AgentDB(db_path)
    entered, release = asyncio.Event(), asyncio.Event()
    got: list[dict] = []

    async def send(report: Report) -> None:
        got.append(report.body)
        if len(got) == 1:
            entered.set()
            await release.wait()

    try:
        outbox = Outbox(send, db=db, **FAST)
        outbox.put(CONTAINERS, "s1", {"n": 1})
        async with running(outbox):
            await asyncio.wait_for(entered.wait(), 2)
            outbox.put(CONTAINERS, "s1", {"n": 2})
            release.set()
            assert await outbox.drained(2)
        assert got == [{"n": 1}, {"n": 2}]
        assert db.outbox_entries() == []
    finally:
        db.close()


async def test_acknowledged_reports_are_deleted_from_the_database(db_path):
    db = AgentDB(db_path)
    sent = Recorder()
    outbox = Outbox(sent, db=db, **FAST)
    outbox.put(STATUS, "s1", {"status": "APPLIED"})
    outbox.put(JOB_COMPLETE, "j1", {"outcome": "succeeded"})
    assert keys(db) == [(STATUS, "s1"), (JOB_COMPLETE, "j1")]
    async with running(outbox):
        assert await outbox.drained(2)
    assert keys(db) == []
    db.close()

    db = AgentDB(db_path)
    try:
        assert db.outbox_entries() == []
        again = Outbox(never_called, db=db, **FAST)
        assert again.pending() == 0 and not again.has(STATUS, "s1")
        assert await again.drained(0.05)  # nothing owed
    finally:
        db.close()


# ---- retries -------------------------------------------------------------------


async def test_unavailable_report_stays_on_disk_and_is_retried_after_retry_after(db_path):
    db = AgentDB(db_path)
    attempts: list[float] = []
    on_disk_during_outage: list[list] = []

    async def send(report: Report) -> None:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            on_disk_during_outage.append(keys(db))
            raise MarketplaceUnavailable("down", retry_after=0.2)

    try:
        outbox = Outbox(send, db=db, **FAST)
        outbox.put(STATUS, "s1", {"status": "APPLIED"})
        async with running(outbox):
            assert await outbox.drained(3)
        assert len(attempts) == 2
        assert attempts[1] - attempts[0] >= 0.2
        assert on_disk_during_outage == [[(STATUS, "s1")]]
        assert outbox.sent == 1 and outbox.rejected == 0 and outbox.dropped == 0
        assert keys(db) == []
    finally:
        db.close()


async def test_a_report_is_retried_until_the_marketplace_is_back(db_path):
    db = AgentDB(db_path)
    attempts: list[str] = []

    async def send(report: Report) -> None:
        attempts.append(report.target)
        if len(attempts) <= 3:
            raise MarketplaceUnavailable("down")  # no Retry-After: backoff from base_delay

    try:
        outbox = Outbox(send, db=db, **FAST)
        outbox.put(STATUS, "s1", {"status": "APPLIED"})
        outbox.put(STATUS, "s2", {"status": "APPLIED"})
        async with running(outbox):
            assert await outbox.drained(3)
        # the head of the queue is retried; the next report waits its turn
        assert attempts == ["s1", "s1", "s1", "s1", "s2"]
        assert outbox.sent == 2 and keys(db) == []
    finally:
        db.close()


async def test_while_unavailable_nothing_drains_and_nothing_is_lost(db_path):
    db = AgentDB(db_path)

    async def send(report: Report) -> None:
        raise MarketplaceUnavailable("down")

    outbox = Outbox(send, db=db, **FAST)
    outbox.put(STATUS, "s1", {"status": "APPLIED"})
    outbox.put(JOB_COMPLETE, "j1", {"outcome": "succeeded"})
    async with running(outbox):
        assert not await outbox.drained(0.1)
    assert outbox.pending() == 2 and outbox.sent == 0 and outbox.rejected == 0
    db.close()
    db = AgentDB(db_path)
    try:
        assert keys(db) == [(STATUS, "s1"), (JOB_COMPLETE, "j1")]
    finally:
        db.close()


async def test_a_rejected_report_is_dropped_counted_and_the_queue_goes_on(db_path):
    db = AgentDB(db_path)
    sent = Recorder()

    async def send(report: Report) -> None:
        if report.target == "gone":
            raise MarketplaceRejected(404, "unknown stack")
        await sent(report)

    try:
        outbox = Outbox(send, db=db, **FAST)
        outbox.put(STATUS, "gone", {"status": "APPLIED"})
        outbox.put(STATUS, "s1", {"status": "APPLIED"})
        async with running(outbox):
            assert await outbox.drained(2)
        assert outbox.rejected == 1 and outbox.sent == 1 and outbox.dropped == 0
        assert sent.got == [(STATUS, "s1", {"status": "APPLIED"})]
        assert not outbox.has(STATUS, "gone") and outbox.pending() == 0
        assert keys(db) == []
    finally:
        db.close()


# ---- the size bound ------------------------------------------------------------


def test_drop_order_puts_container_lists_first_and_usage_last():
    """Snapshots the agent sends again go first; usage, what the host is paid for, last."""
    assert DROP_ORDER == (CONTAINERS, SYSTEM_DATA, INIT_STATE, STATUS, JOB_COMPLETE, USAGE)


async def test_bound_drops_by_kind_then_age_and_the_count_survives_a_reopen(db_path):
    db = AgentDB(db_path)
    outbox = Outbox(never_called, db=db, max_entries=5, **FAST)
    outbox.put(JOB_COMPLETE, "j1", {"n": 1})
    outbox.put(STATUS, "s1", {"n": 1})
    outbox.put(CONTAINERS, "c1", {"n": 1})
    outbox.put(SYSTEM_DATA, "env", {"n": 1})
    outbox.put(INIT_STATE, "env", {"n": 1})
    assert outbox.pending() == 5 and outbox.dropped == 0

    outbox.put(STATUS, "s1", {"n": 2})  # a replacement does not grow the queue
    assert outbox.pending() == 5 and outbox.dropped == 0

    steps = [
        ((CONTAINERS, "c2"), (CONTAINERS, "c1")),  # containers first, the oldest of them
        ((STATUS, "s2"), (CONTAINERS, "c2")),  # then the newer container list
        ((JOB_COMPLETE, "j2"), (SYSTEM_DATA, "env")),
        ((JOB_COMPLETE, "j3"), (INIT_STATE, "env")),
        ((JOB_COMPLETE, "j4"), (STATUS, "s1")),  # statuses, oldest first
        ((JOB_COMPLETE, "j5"), (STATUS, "s2")),
        ((JOB_COMPLETE, "j6"), (JOB_COMPLETE, "j1")),  # job completions last, oldest first
    ]
    for count, (new, victim) in enumerate(steps, start=1):
        assert outbox.has(*victim)
        outbox.put(*new, {"n": count})
        assert outbox.has(*new), new
        assert not outbox.has(*victim), victim
        assert outbox.pending() == 5
        assert outbox.dropped == count
        assert len(keys(db)) == 5 and victim not in keys(db)
        assert db.meta("reports_dropped") == str(count)

    remaining = [(JOB_COMPLETE, f"j{i}") for i in range(2, 7)]
    assert keys(db) == remaining
    del outbox
    db.close()

    db = AgentDB(db_path)
    try:
        assert db.meta("reports_dropped") == "7"
        sent = Recorder()
        outbox = Outbox(sent, db=db, max_entries=5, **FAST)
        assert outbox.dropped == 7 and outbox.pending() == 5
        async with running(outbox):
            assert await outbox.drained(2)
        assert [(kind, target) for kind, target, _ in sent.got] == remaining
        assert outbox.dropped == 7  # sending does not count as dropping
    finally:
        db.close()


async def test_a_full_queue_after_restart_keeps_dropping_the_oldest_restored_first(db_path):
    db = AgentDB(db_path)
    before = Outbox(never_called, db=db, max_entries=3, **FAST)
    before.put(CONTAINERS, "old", {})
    before.put(CONTAINERS, "mid", {})
    before.put(STATUS, "s1", {})
    del before
    db.close()

    db = AgentDB(db_path)
    try:
        outbox = Outbox(never_called, db=db, max_entries=3, **FAST)
        outbox.put(CONTAINERS, "new", {})
        assert not outbox.has(CONTAINERS, "old")
        assert outbox.has(CONTAINERS, "mid") and outbox.has(CONTAINERS, "new") and outbox.has(STATUS, "s1")
        assert outbox.dropped == 1 and db.meta("reports_dropped") == "1"
    finally:
        db.close()


async def test_in_memory_database_the_bound_and_counters_still_work():
    outbox = Outbox(never_called, AgentDB(None), max_entries=2, **FAST)
    assert outbox.dropped == 0 and outbox.pending() == 0
    assert await outbox.drained(0.01)
    outbox.put(JOB_COMPLETE, "j1", {})
    outbox.put(CONTAINERS, "s1", {})
    outbox.put(JOB_COMPLETE, "j2", {})
    assert outbox.dropped == 1 and not outbox.has(CONTAINERS, "s1")
    assert outbox.has(JOB_COMPLETE, "j1") and outbox.has(JOB_COMPLETE, "j2")
    assert not await outbox.drained(0.02)


# ---- a removed stack -----------------------------------------------------------


@pytest.mark.parametrize("durable", [False, True], ids=["in-memory", "on-disk"])
async def test_a_removed_status_supersedes_the_stacks_unsent_container_list(db_path, durable):
    """The marketplace drops a removed stack's container list: a list still
    queued when REMOVED is put is never sent (nor kept on disk), while the
    REMOVED status is; other stacks' lists and other statuses are left alone."""
    db = AgentDB(db_path if durable else None)
    try:
        sent = Recorder()
        outbox = Outbox(sent, db=db, **FAST)  # not running yet: everything stays queued
        outbox.put(CONTAINERS, "s1", {"containers": [{"Name": "p-app-1"}]})
        outbox.put(CONTAINERS, "s2", {"containers": [{"Name": "q-app-1"}]})
        outbox.put(STATUS, "s2", {"status": "APPLIED"})  # not a removal: s2's list stays
        outbox.put(STATUS, "s1", {"status": REMOVED})
        assert not outbox.has(CONTAINERS, "s1") and outbox.has(STATUS, "s1")
        assert outbox.has(CONTAINERS, "s2") and outbox.pending() == 3
        assert keys(db) == [(CONTAINERS, "s2"), (STATUS, "s2"), (STATUS, "s1")]

        async with running(outbox):
            assert await outbox.drained(5)
        assert sent.got == [
            (CONTAINERS, "s2", {"containers": [{"Name": "q-app-1"}]}),
            (STATUS, "s2", {"status": "APPLIED"}),
            (STATUS, "s1", {"status": REMOVED}),
        ]
        assert (CONTAINERS, "s1") not in [(kind, target) for kind, target, _ in sent.got]
    finally:
        db.close()


# ---- has / pending / drained ---------------------------------------------------


async def test_has_pending_and_drained_follow_the_queue(db_path):
    db = AgentDB(db_path)
    gate = asyncio.Event()
    sent = Recorder()

    async def send(report: Report) -> None:
        await gate.wait()
        await sent(report)

    try:
        outbox = Outbox(send, db=db, **FAST)
        assert outbox.pending() == 0 and not outbox.has(STATUS, "s1")
        assert await outbox.drained(0.01)  # empty: drained at once
        outbox.put(STATUS, "s1", {"status": "APPLIED"})
        outbox.put(CONTAINERS, "s1", {"n": 1})
        assert outbox.pending() == 2
        assert outbox.has(STATUS, "s1") and outbox.has(CONTAINERS, "s1")
        assert not outbox.has(STATUS, "s2") and not outbox.has(JOB_COMPLETE, "s1")
        async with running(outbox):
            assert not await outbox.drained(0.05)  # the marketplace has not answered yet
            assert outbox.pending() == 2
            gate.set()
            assert await outbox.drained(2)
            assert outbox.pending() == 0 and not outbox.has(STATUS, "s1")
            outbox.put(JOB_COMPLETE, "j1", {})  # the running outbox wakes up for new reports
            assert outbox.has(JOB_COMPLETE, "j1")
            assert await outbox.drained(2)
        assert [(kind, target) for kind, target, _ in sent.got] == [
            (STATUS, "s1"),
            (CONTAINERS, "s1"),
            (JOB_COMPLETE, "j1"),
        ]
    finally:
        db.close()

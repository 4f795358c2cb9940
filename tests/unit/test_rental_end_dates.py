"""What a desired state's rental list costs the host: its end
dates recorded only for the host's own rentals, in one transaction; lists longer
than a host could hold refused; the rental clock's ends in flight bounded."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from support.fakes import FakeOutbox
from support.wiring import dispatcher_for

from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.reconcile import desired_state
from gpuhost_agent.core.rental_clock import ENDINGS_AT_ONCE, RentalClock
from gpuhost_agent.core.rentals.end_dates import RentalEndDates, dates_of_this_host
from gpuhost_agent.protocol import wire_jobs, wire_time
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.session import SessionState


def test_only_the_rentals_of_this_host_have_their_dates_recorded() -> None:
    soon = wire_time.utcnow() + timedelta(hours=1)
    listed = {f"r-{index}": soon for index in range(5000)} | {"r-here": soon, "r-open": None}
    dates = dates_of_this_host(listed, {"r-here", "r-open", "r-gone"})
    assert dates == [("r-here", wire_time.iso(soon)), ("r-open", None)]


def test_the_dates_are_written_in_one_transaction(tmp_path: Path) -> None:
    db = AgentDB(tmp_path / "agent.db")
    said: list[str] = []
    db._conn.set_trace_callback(said.append)
    end_dates = RentalEndDates(db)
    end_dates.note_many([(f"r-{index}", wire_time.iso()) for index in range(200)])
    assert [statement for statement in said if statement in ("BEGIN IMMEDIATE", "COMMIT")] == [
        "BEGIN IMMEDIATE",
        "COMMIT",
    ]
    assert len(db.rentals()) == 200 and end_dates.changed.is_set()


def test_a_list_longer_than_a_host_could_hold_is_refused() -> None:
    entry = {"rentalId": "r", "status": "ACTIVE", "endDate": None, "gpuCount": 0}
    too_many = [dict(entry, rentalId=f"r-{index}") for index in range(desired_state.MAX_LISTED + 1)]
    with pytest.raises(wire_jobs.InvalidBody, match="lists 4097 rentals, more than the 4096"):
        desired_state.decode({"envId": "e", "stacks": [], "rentals": too_many})
    assert desired_state.decode({"envId": "e", "stacks": [], "rentals": too_many[:-1]}).rentals


class _HeldEnds:
    """A deployer whose rental ends wait until released (they stay in flight), then
    record the end as the real one does (its GPUs released)."""

    def __init__(self, ledger: GpuLedger) -> None:
        self.ledger = ledger
        self.release = asyncio.Event()
        self.ending: list[str] = []

    def rental_ending(self, rental_id: str) -> None:
        """The dispatcher tells the deployer first (its GPUs begin their release)."""

    async def end_rental(self, job: wire_jobs.StackJob) -> str:
        self.ending.append(job.rental_id)
        await self.release.wait()
        self.ledger.release(job.rental_id)
        return ""


async def test_the_clock_has_at_most_a_few_rental_ends_in_flight() -> None:
    db = AgentDB(None)
    past = wire_time.iso(wire_time.utcnow() - timedelta(minutes=1))
    for index in range(20):
        db.rental_end_date(f"r-{index:02d}", past)
    ledger = GpuLedger(db)
    deployer = _HeldEnds(ledger)
    dispatcher = dispatcher_for(deployer, FakeOutbox(), db)
    session = SessionState()
    session.env_id = "env-1"
    clock = RentalClock(RentalEndDates(db), dispatcher, ledger, session)
    task = asyncio.create_task(clock.run())
    try:
        await asyncio.sleep(0.3)
        assert not task.done() or task.exception() is None, task.exception()
        assert len(clock.ended) == ENDINGS_AT_ONCE and len(deployer.ending) == ENDINGS_AT_ONCE
        deployer.release.set()
        for _ in range(100):
            if len(clock.ended) == 20:
                break
            await asyncio.sleep(0.1)
        assert sorted(clock.ended) == [f"r-{index:02d}" for index in range(20)]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

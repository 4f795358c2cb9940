"""GPUs being released by an ending rental, the decisions: what the
ledger says of each GPU, whether a release would make room, the listing's
availableGPUs from the agent's account, and the heartbeat field's checks.
(End to end: tests/integration/test_gpu_release_engine.py.)"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from support.machine_samples import heartbeat

from gpuhost_agent.core.gpus.allocation import GpuSlot
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.local_marketplace.host_api import heartbeat_problem
from gpuhost_agent.local_marketplace.shapes import available_gpus
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import wire_time
from gpuhost_agent.storage.agent_db import AgentDB

SLOTS = [GpuSlot("G0"), GpuSlot("G1"), GpuSlot("G2"), GpuSlot("G3", healthy=False, reason="ECC")]


def test_states_say_free_assigned_releasing_and_out_of_service(tmp_path) -> None:
    ledger = GpuLedger(AgentDB(tmp_path / "agent.db"))
    changes: list[str] = []
    ledger.on_change.append(lambda: changes.append("x"))
    ledger.commit("old", ["G0", "G1"])
    assert not ledger.fits_after_release(SLOTS, "new", 2)  # nothing is ending
    ledger.begin_release("old")
    ledger.begin_release("unknown")  # holds nothing: nothing to say
    assert ledger.states(SLOTS) == {
        "free": ["G2"],
        "assigned": {},
        "releasing": {"old": ["G0", "G1"]},
        "outOfService": ["G3"],
    }
    assert ledger.fits_after_release(SLOTS, "new", 2) and not ledger.fits_after_release(SLOTS, "new", 4)
    assert ledger.release("old") == ["G0", "G1"] and not ledger.releasing
    assert ledger.states(SLOTS)["free"] == ["G0", "G1", "G2"]
    assert changes == ["x", "x", "x"]  # assigned, being released, freed


async def test_a_waiter_wakes_when_a_rental_is_released(tmp_path) -> None:
    ledger = GpuLedger(AgentDB(tmp_path / "agent.db"))
    ledger.commit("old", ["G0"])
    waiter = asyncio.create_task(ledger.wait_for_release(5))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    ledger.release("old")
    await asyncio.wait_for(waiter, 1)
    await ledger.wait_for_release(0.01)  # and a wait with nothing released just times out


def test_available_gpus_follow_the_agents_account() -> None:
    store = Store(envId="e", envApiKey="k", renterApiKey="r")
    active = [{"rentalId": "a", "gpuCount": 2}, {"rentalId": "b", "gpuCount": 1}]
    assert available_gpus(store, 8, active) == 5  # no heartbeat yet: by count
    store.live["gpuAssignments"] = {
        "free": ["G4", "G5", "G6"],
        "assigned": {"a": ["G0", "G1"]},
        "releasing": {"ended": ["G2"]},
        "outOfService": ["G3", "G7"],
    }
    assert available_gpus(store, 8, active) == 3  # 3 free + 1 being released - 1 that b will take
    store.live["gpuAssignments"]["free"] = []
    assert available_gpus(store, 8, active) == 0  # never below 0


def test_heartbeat_gpu_assignments_are_checked() -> None:
    beat = heartbeat()
    assert heartbeat_problem(beat) is None  # optional
    good = {"free": ["G0"], "assigned": {"r": ["G1"]}, "releasing": {}, "outOfService": []}
    assert heartbeat_problem({**beat, "gpuAssignments": good}) is None
    for bad, word in (
        ([], "must be an object"),
        ({"free": "G0"}, "gpuAssignments.free"),
        ({"assigned": {"r": "G1"}}, "gpuAssignments.assigned"),
        ({"releasing": [["G1"]]}, "gpuAssignments.releasing"),
        ({"outOfService": [1]}, "gpuAssignments.outOfService"),
    ):
        assert word in (heartbeat_problem({**beat, "gpuAssignments": bad}) or ""), bad


def test_ended_rentals_are_remembered_for_a_week_then_forgotten(tmp_path) -> None:
    """A late deploy of an ended rental is refused while it is remembered; a
    host ends thousands of rentals a year, and each was a row kept forever."""
    db = AgentDB(tmp_path / "agent.db")
    ledger = GpuLedger(db)
    ledger.commit("last-month", ["G0"])
    ledger.release("last-month")
    ledger.release("yesterday")
    month_ago = wire_time.iso(wire_time.utcnow() - timedelta(days=30))
    db._write("UPDATE rentals SET ended_at = ? WHERE rental_id = ?", month_ago, "last-month")
    db._write(
        "UPDATE rentals SET ended_at = ? WHERE rental_id = ?",
        wire_time.iso(wire_time.utcnow() - timedelta(days=1)),
        "yesterday",
    )
    assert ledger.has_ended("last-month") and ledger.has_ended("yesterday")

    ledger.release("today")
    assert not ledger.has_ended("last-month") and "last-month" not in db.rentals()
    assert ledger.has_ended("yesterday") and ledger.has_ended("today")
    assert not GpuLedger(db).has_ended("last-month")  # after a restart too
    assert GpuLedger(db).has_ended("yesterday")

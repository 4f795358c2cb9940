"""The usage meter counts each GPU-second once: on a real
ledger and state database, with the outbox that would carry the reports, and
a clock the test moves. The crash cases reopen the database file as a
restarted agent would."""

from __future__ import annotations

import pytest
from support.fakes import never_called

from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.rentals.usage_meter import UsageMeter
from gpuhost_agent.core.rentals.usage_slots import SLOT_SECONDS, accrue, split
from gpuhost_agent.service.config import default_of
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.outbox import Outbox
from gpuhost_agent.uplink.reports import USAGE

T0 = 1_800_000_000.0 - 1_800_000_000.0 % SLOT_SECONDS  # a slot boundary


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Agent:
    """The meter's collaborators as the composition root wires them."""

    def __init__(self, path, clock: Clock, *, boot_time: float = T0 - 3600, busy: dict | None = None):
        self.db = AgentDB(path)
        self.ledger = GpuLedger(self.db)
        self.outbox = Outbox(never_called, self.db)
        self.busy = busy or {}

        async def read_busy() -> dict[str, float]:
            return dict(self.busy)

        self.meter = UsageMeter(
            self.db,
            self.ledger,
            self.outbox.put,
            read_busy,
            boot_time=boot_time,
            clock=clock,
            interval=default_of("usage_seconds"),
        )
        self.ledger.on_change.append(self.meter.count)
        self.meter.recover()

    def totals(self) -> dict[tuple[str, str], list[float]]:
        """Per (rental, GPU), the figures the marketplace would keep from the queued reports."""
        sums: dict[tuple[str, str], list[float]] = {}
        for kind, _target, _seq, body in self.db.outbox_entries():
            if kind != USAGE:
                continue
            for gpu in body["gpus"]:
                figures = sums.setdefault((body["rentalId"], gpu["uuid"]), [0.0] * 4)
                for index, key in enumerate(("seconds", "busySeconds", "lostSeconds", "offlineSeconds")):
                    figures[index] += gpu[key]
        return sums


def test_split_cuts_at_slot_boundaries_and_loses_nothing() -> None:
    pieces = split(T0 - 100, T0 + 2 * SLOT_SECONDS + 50)
    assert [slot for slot, _ in pieces] == [T0 - SLOT_SECONDS, T0, T0 + SLOT_SECONDS, T0 + 2 * SLOT_SECONDS]
    assert sum(seconds for _, seconds in pieces) == pytest.approx(2 * SLOT_SECONDS + 150)


def test_a_second_lands_in_one_heap() -> None:
    held = {"r1": ["GPU-a", "GPU-b"]}
    used = accrue(T0, T0 + 10, held, busy_percent={"GPU-a": 50}, out_of_service={"GPU-b"})
    assert {a.uuid: a.figures for a in used} == {"GPU-a": (10, 5, 0, 0), "GPU-b": (0, 0, 10, 0)}
    offline = accrue(T0, T0 + 10, held, busy_percent={"GPU-a": 50}, out_of_service=set(), offline=True)
    assert {a.figures for a in offline} == {(0, 0, 0, 10)}


async def test_assignment_and_release_count_to_the_second(tmp_path) -> None:
    clock = Clock()
    agent = Agent(tmp_path / "agent.db", clock, busy={"GPU-a": 25.0})
    clock.now += 7
    agent.ledger.commit("r1", ["GPU-a"])  # assigned at T0+7
    clock.now += 60
    await agent.meter.tick()
    clock.now += 3
    agent.ledger.begin_release("r1")  # the rental ended at T0+70: nothing counts after it
    clock.now += 30
    agent.ledger.release("r1")
    await agent.meter.tick()
    seconds, busy, lost, offline = agent.totals()[("r1", "GPU-a")]
    assert seconds == pytest.approx(63) and busy == pytest.approx(63 * 0.25)
    assert lost == offline == 0


async def test_a_gpu_out_of_service_counts_as_lost_from_the_fault_on(tmp_path) -> None:
    clock = Clock()
    agent = Agent(tmp_path / "agent.db", clock)
    agent.ledger.commit("r1", ["GPU-a"])
    clock.now += 40
    agent.ledger.mark_out_of_service("GPU-a", "Xid 79")
    clock.now += 20
    await agent.meter.tick()
    assert agent.totals()[("r1", "GPU-a")] == pytest.approx([40, 0, 20, 0])


async def test_a_kill_9_counts_the_time_away_once_and_as_used_when_the_machine_stayed_up(tmp_path) -> None:
    clock = Clock()
    first = Agent(tmp_path / "agent.db", clock)
    first.ledger.commit("r1", ["GPU-a", "GPU-b"])
    clock.now += 50
    await first.meter.tick()
    clock.now += 2000  # killed; the containers ran on; restarted across two slot boundaries
    restarted = Agent(tmp_path / "agent.db", clock)  # the same file: what the kill left
    clock.now += 10
    await restarted.meter.tick()
    for gpu in ("GPU-a", "GPU-b"):
        assert restarted.totals()[("r1", gpu)] == pytest.approx([2060, 0, 0, 0])
    slots = {body["slotStart"] for kind, _, _, body in restarted.db.outbox_entries() if kind == USAGE}
    assert len(slots) == 3  # every slot the gap touched is reported


async def test_time_away_across_a_reboot_is_offline_not_billed(tmp_path) -> None:
    clock = Clock()
    first = Agent(tmp_path / "agent.db", clock)
    first.ledger.commit("r1", ["GPU-a"])
    clock.now += 30
    await first.meter.tick()
    clock.now += 300
    restarted = Agent(tmp_path / "agent.db", clock, boot_time=clock.now - 60)
    assert restarted.totals()[("r1", "GPU-a")] == pytest.approx([30, 0, 0, 300])


async def test_a_crash_inside_a_count_leaves_none_of_it(tmp_path) -> None:
    """The seconds, the moment counted and the reports are one transaction:
    a count that dies half-way is counted again in full, never twice."""
    clock = Clock()
    agent = Agent(tmp_path / "agent.db", clock)
    agent.ledger.commit("r1", ["GPU-a"])
    clock.now += 100

    def dying_put(kind: str, target: str, body: dict) -> None:
        raise RuntimeError("killed half-way")

    agent.meter.put_report = dying_put
    with pytest.raises(RuntimeError):
        await agent.meter.tick()
    restarted = Agent(tmp_path / "agent.db", clock)
    assert restarted.totals()[("r1", "GPU-a")] == pytest.approx([100, 0, 0, 0])


async def test_old_slots_are_pruned_from_the_database(tmp_path) -> None:
    clock = Clock()
    agent = Agent(tmp_path / "agent.db", clock)
    agent.ledger.commit("r1", ["GPU-a"])
    for _ in range(10):
        clock.now += SLOT_SECONDS
        await agent.meter.tick()
    kept = {row["slot_start"] for row in agent.db._rows("SELECT slot_start FROM usage")}
    assert kept == {clock.now - SLOT_SECONDS}  # the last slot counted; the nine before it are final and gone

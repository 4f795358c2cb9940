"""GPU usage the host can bill: counted by the agent, durably, reported until acknowledged.

The meter counts, every tick and at every change of the GPU ledger, the time
since its last count for the GPUs each rental held at that count
(core.usage_slots says which heap a second lands in). Counting at the
ledger's changes is what makes an assignment or a release exact to the
second rather than to the tick.

Nothing is counted twice and nothing is lost:
- the seconds added, the moment of the count and the GPUs then held are one
  SQLite transaction together with the reports that carry the new totals, so
  a kill -9 leaves either all of a count or none of it;
- a report carries a slot's running totals (not the increment), and the
  marketplace keeps the largest figure it has seen per GPU and slot: a report
  sent twice, late or out of order changes nothing;
- at start-up the time since the last count is counted for the GPUs the same
  rental still holds: as used when the machine stayed up (the containers ran
  on without the agent), as offline when it booted since.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.rentals.usage_slots import SLOT_SECONDS, Accrual, accrue, slot_of, still_held
from gpuhost_agent.protocol import wire_time
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.reports import USAGE

log = get_logger(__name__)

PutReport = Callable[[str, str, dict[str, object]], None]
ReadBusy = Callable[[], Awaitable[dict[str, float]]]


class UsageMeter:
    def __init__(
        self,
        db: AgentDB,
        ledger: GpuLedger,
        put_report: PutReport,
        read_busy: ReadBusy,
        *,
        boot_time: float,
        clock: Callable[[], float],
        interval: float,
    ):
        self.db = db
        self.ledger = ledger
        self.put_report = put_report
        self.read_busy = read_busy
        self.boot_time = boot_time
        self.clock = clock
        self.interval = interval
        self._held: dict[str, list[str]] = {}
        self._out_of_service: set[str] = set()
        self._busy: dict[str, float] = {}
        self._counted_at: float | None = None

    def _held_now(self) -> dict[str, list[str]]:
        releasing = self.ledger.releasing
        return {rental: list(uuids) for rental, uuids in self.ledger.assignments.items() if rental not in releasing}

    def recover(self) -> None:
        """At start-up, before the first count: the time the agent was away."""
        now = self.clock()
        counted_at = self.db.meta("usage_counted_at")
        accruals: list[Accrual] = []
        if counted_at is not None and float(counted_at) < now:
            since = float(counted_at)
            held = still_held(json.loads(self.db.meta("usage_held") or "{}"), self._held_now())
            rebooted = self.boot_time > since
            accruals = accrue(
                since, now, held, busy_percent={}, out_of_service=set(self.ledger.out_of_service), offline=rebooted
            )
            if held:
                log.info(
                    "usage_gap_counted",
                    seconds=round(now - since, 1),
                    gpus=sum(len(uuids) for uuids in held.values()),
                    counted_as="offline (the machine rebooted)" if rebooted else "used (the machine stayed up)",
                )
        self._commit(accruals, now)

    async def tick(self) -> None:
        self._busy = await self.read_busy()
        self.count()

    def count(self) -> None:
        """Count up to now with the GPUs held since the last count (the ledger
        calls this after each change, so that count still uses the old ones)."""
        if self._counted_at is None:
            self.recover()
            return
        now = max(self.clock(), self._counted_at)
        accruals = accrue(
            self._counted_at, now, self._held, busy_percent=self._busy, out_of_service=self._out_of_service
        )
        self._commit(accruals, now)

    def _commit(self, accruals: list[Accrual], now: float) -> None:
        held = self._held_now()
        with self.db.transaction():
            for accrual in accruals:
                self.db.usage_add(accrual.rental_id, accrual.uuid, accrual.slot_start, accrual.figures)
            for rental_id, slot in sorted({(a.rental_id, a.slot_start) for a in accruals}):
                self._queue_report(rental_id, slot, now)
            self.db.set_meta("usage_counted_at", repr(now))
            self.db.set_meta("usage_held", json.dumps(held, sort_keys=True))
            self.db.usage_prune(slot_of(now) - SLOT_SECONDS)  # later counts start at `now`: older slots are final
        self._counted_at = now
        self._held = held
        self._out_of_service = set(self.ledger.out_of_service)

    def _queue_report(self, rental_id: str, slot: int, now: float) -> None:
        rows = self.db.usage_slot(rental_id, slot)
        body = {
            "rentalId": rental_id,
            "slotStart": wire_time.iso_from_timestamp(slot),
            "slotSeconds": SLOT_SECONDS,
            "gpus": [
                {
                    "uuid": row["gpu_uuid"],
                    "seconds": round(row["seconds"], 3),
                    "busySeconds": round(row["busy"], 3),
                    "lostSeconds": round(row["lost"], 3),
                    "offlineSeconds": round(row["offline"], 3),
                }
                for row in rows
            ],
            "countedAt": wire_time.iso_from_timestamp(now),
        }
        self.put_report(USAGE, f"{rental_id}@{body['slotStart']}", body)

"""The GPU assignments of the rentals on this machine, kept in the state database.

An assignment must outlive the agent (a restart must not hand a rental's GPUs
to someone else while its containers still use them), so every change is
committed before it takes effect. Ended rentals are remembered so that a late,
redelivered deploy job cannot bring one back, for ENDED_KEPT: a marketplace
redelivers within minutes and lists an ended rental for a day, while a host
ends thousands of rentals in a year, each a row kept forever otherwise (the
soak, bench/soak.py, showed the table only growing). When the database had to be
started afresh, `adopt` takes the assignments back from the containers'
labels (wire.LABEL_GPUS).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from gpuhost_agent.core.gpus.allocation import GpuSlot, NotEnoughGpus, allocate
from gpuhost_agent.protocol import wire, wire_time
from gpuhost_agent.storage.agent_db import AgentDB

ENDED_KEPT = timedelta(days=7)  # how long an ended rental is remembered


class GpuLedger:
    def __init__(self, db: AgentDB):
        self.db = db
        self.assignments: dict[str, list[str]] = {}
        self.ended: set[str] = set()
        self.releasing: set[str] = set()  # rentals ending: their GPUs are free once their containers are gone
        self.out_of_service: dict[str, str] = {}  # GPU uuid -> why (an NVML fault event), until the agent restarts
        self.on_change: list[Callable[[], None]] = []  # told when GPUs are assigned, being released or freed
        self._released = asyncio.Event()
        for rental_id, row in db.rentals().items():
            if row["ended_at"]:
                self.ended.add(rental_id)
            elif row["gpus"]:
                self.assignments[rental_id] = list(row["gpus"])

    def has_ended(self, rental_id: str) -> bool:
        return rental_id in self.ended

    def is_over(self, rental_id: str) -> bool:
        """Ended, or past its endDate on the host's clock (ending any moment)."""
        if rental_id in self.ended:
            return True
        end = (self.db.rentals().get(rental_id) or {}).get("end_date")
        return isinstance(end, str) and bool(end) and wire_time.parse_iso(end) <= wire_time.utcnow()

    def plan(self, slots: list[GpuSlot], rental_id: str, count: int) -> list[str]:
        """What the rental would get; nothing is recorded (see commit)."""
        return allocate(self.with_faults(slots), self.assignments, rental_id, count)

    def with_faults(self, slots: list[GpuSlot]) -> list[GpuSlot]:
        """The probe's slots, with the GPUs a fault event took out of service since."""
        return [
            GpuSlot(slot.uuid, False, self.out_of_service[slot.uuid]) if slot.uuid in self.out_of_service else slot
            for slot in slots
        ]

    def mark_out_of_service(self, uuid: str, reason: str) -> bool:
        """A fault event: the GPU is handed to no one from now on. False if it already was."""
        if uuid in self.out_of_service:
            return False
        self.out_of_service[uuid] = reason
        self._changed()
        return True

    def holder(self, uuid: str) -> str | None:
        """The rental the GPU is assigned to, if any."""
        return next((rental for rental, uuids in self.assignments.items() if uuid in uuids), None)

    def fits_after_release(self, slots: list[GpuSlot], rental_id: str, count: int) -> bool:
        """Whether the rental would get its GPUs once the ending rentals' are free."""
        staying = {rental: uuids for rental, uuids in self.assignments.items() if rental not in self.releasing}
        try:
            allocate(self.with_faults(slots), staying, rental_id, count)
        except NotEnoughGpus:
            return False
        return True

    def states(self, slots: list[GpuSlot]) -> wire.GpuStates:
        """Which GPUs are free, assigned (by rental), being released (by rental)
        and out of service: what the heartbeat tells the marketplace."""
        held = {uuid for uuids in self.assignments.values() for uuid in uuids}
        slots = self.with_faults(slots)
        return {
            "free": [slot.uuid for slot in slots if slot.healthy and slot.uuid not in held],
            "assigned": {r: list(u) for r, u in sorted(self.assignments.items()) if r not in self.releasing},
            "releasing": {r: list(u) for r, u in sorted(self.assignments.items()) if r in self.releasing},
            "outOfService": [slot.uuid for slot in slots if not slot.healthy and slot.uuid not in held],
        }

    async def wait_for_release(self, timeout: float) -> None:
        """Until a rental's GPUs are freed, or the timeout."""
        self._released.clear()
        try:
            await asyncio.wait_for(self._released.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def begin_release(self, rental_id: str) -> None:
        """The rental is ending: its containers are being stopped."""
        if rental_id in self.assignments and rental_id not in self.releasing:
            self.releasing.add(rental_id)
            self._changed()

    def commit(self, rental_id: str, uuids: list[str]) -> None:
        if self.assignments.get(rental_id) != uuids and uuids:
            self.db.rental_gpus(rental_id, list(uuids))
            self.assignments[rental_id] = list(uuids)
            self._changed()

    def adopt(self, rental_id: str, uuids: list[str]) -> None:
        """GPUs found in use by a rental's containers and not on record."""
        if rental_id not in self.assignments and rental_id not in self.ended and uuids:
            self.commit(rental_id, sorted(set(uuids)))

    def import_legacy(self, path: Path) -> None:
        """Take over gpu-assignments.json from agents before the state database."""
        if not path.exists():
            return
        raw = json.loads(path.read_text())
        for rental_id, uuids in (raw.get("assignments") or {}).items():
            self.adopt(rental_id, list(uuids))
        for rental_id in raw.get("ended") or []:
            if rental_id not in self.ended:
                self.db.rental_ended(rental_id)
                self.ended.add(rental_id)
        path.rename(path.with_suffix(".json.imported"))

    def release(self, rental_id: str) -> list[str]:
        """The rental has ended: its GPUs are free again. Rentals that ended
        more than ENDED_KEPT ago are forgotten now."""
        self.db.rental_ended(rental_id)
        self.ended.add(rental_id)
        self.ended.difference_update(
            self.db.forget_rentals_ended_before(wire_time.iso(wire_time.utcnow() - ENDED_KEPT))
        )
        self.releasing.discard(rental_id)
        freed = self.assignments.pop(rental_id, [])
        self._released.set()
        self._changed()
        return freed

    def _changed(self) -> None:
        for listener in self.on_change:
            listener()

"""The GPU assignments of the rentals on this machine, kept on disk.

An assignment must outlive the agent (a restart must not hand a rental's GPUs
to someone else while its containers still use them), so every change is
written atomically (write, fsync, rename) before it takes effect. Ended
rentals are remembered so that a late, redelivered deploy job cannot bring
one back.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import wire
from ..state_files import write_json_atomically
from .gpu_allocation import GpuSlot, allocate

_MAX_ENDED = 10_000


class GpuLedger:
    def __init__(self, path: Path):
        self.path = path
        self.assignments: dict[str, list[str]] = {}
        self.ended: list[str] = []
        if path.exists():
            raw = json.loads(path.read_text())
            self.assignments = {k: list(v) for k, v in raw.get("assignments", {}).items()}
            self.ended = list(raw.get("ended", []))

    def _save(self) -> None:
        write_json_atomically(self.path, {"assignments": self.assignments, "ended": self.ended,
                                          "savedAt": wire.iso()})

    def has_ended(self, rental_id: str) -> bool:
        return rental_id in self.ended

    def plan(self, slots: list[GpuSlot], rental_id: str, count: int) -> list[str]:
        """What the rental would get; nothing is recorded (see commit)."""
        return allocate(slots, self.assignments, rental_id, count)

    def commit(self, rental_id: str, uuids: list[str]) -> None:
        if self.assignments.get(rental_id) != uuids and uuids:
            self.assignments[rental_id] = list(uuids)
            self._save()

    def release(self, rental_id: str) -> list[str]:
        """The rental has ended: its GPUs are free again."""
        freed = self.assignments.pop(rental_id, [])
        if rental_id not in self.ended:
            self.ended.append(rental_id)
            del self.ended[:-_MAX_ENDED]
        self._save()
        return freed

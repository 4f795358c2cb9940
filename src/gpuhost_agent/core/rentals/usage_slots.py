"""How GPU-seconds are counted: pure arithmetic, no clock and no database.

Time is cut into fixed slots of SLOT_SECONDS on the UTC epoch. Every time zone
in use is offset from UTC by a multiple of 15 minutes, so 15-minute slots add
up to whole days in any zone the marketplace's usage page is asked for.

Each second a rental holds a GPU lands in exactly one of three heaps:
- used: the GPU was the rental's and worked (billed); "busy" is the part of
  it NVML saw the GPU working (the utilisation at the meter's last sample),
- lost: the GPU was the rental's but out of service (an Xid or ECC event),
- offline: the machine itself was down (rebooted while the agent was away).
A rental whose GPUs are being released (it has ended) accrues nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

SLOT_SECONDS = 900


@dataclass(frozen=True)
class Accrual:
    rental_id: str
    uuid: str
    slot_start: int  # epoch seconds, a multiple of SLOT_SECONDS
    seconds: float
    busy: float
    lost: float
    offline: float

    @property
    def figures(self) -> tuple[float, float, float, float]:
        return self.seconds, self.busy, self.lost, self.offline


def slot_of(moment: float) -> int:
    return int(moment // SLOT_SECONDS) * SLOT_SECONDS


def split(start: float, end: float) -> list[tuple[int, float]]:
    """[start, end) cut at slot boundaries: (slot start, seconds in it)."""
    pieces = []
    while end > start:
        slot = slot_of(start)
        stop = min(end, slot + SLOT_SECONDS)
        pieces.append((slot, stop - start))
        start = stop
    return pieces


def accrue(
    start: float,
    end: float,
    held: dict[str, list[str]],
    *,
    busy_percent: dict[str, float],
    out_of_service: set[str],
    offline: bool = False,
) -> list[Accrual]:
    """What [start, end) adds for the GPUs `held` (rental id -> GPU UUIDs)
    throughout it."""
    accruals = []
    for slot, seconds in split(start, end):
        for rental_id, uuids in sorted(held.items()):
            for uuid in uuids:
                if offline:
                    figures = (0.0, 0.0, 0.0, seconds)
                elif uuid in out_of_service:
                    figures = (0.0, 0.0, seconds, 0.0)
                else:
                    share = min(100.0, max(0.0, busy_percent.get(uuid, 0.0))) / 100
                    figures = (seconds, seconds * share, 0.0, 0.0)
                accruals.append(Accrual(rental_id, uuid, slot, *figures))
    return accruals


def still_held(before: dict[str, list[str]], now: dict[str, list[str]]) -> dict[str, list[str]]:
    """The GPUs held at the last count that the same rental still holds: the
    ones whose time while the agent was away can be counted at all."""
    kept = {rental: [uuid for uuid in uuids if uuid in now.get(rental, [])] for rental, uuids in before.items()}
    return {rental: uuids for rental, uuids in kept.items() if uuids}

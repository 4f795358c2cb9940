"""Every exec the host pays for, rate-limited per rental.

An SSH session, a terminal and `scp -O` each start a Docker exec: dockerd,
containerd and runc do that work outside the rental's share. Their number is
capped (limits.py), their rate was not: open-and-close loops ran 146,000 of
them in 0.2 s on a stand-in engine. A token bucket per rental allows a burst
(an editor opening its sessions at once) and then a steady rate; a refusal
says why. Full buckets are dropped, so memory follows the rentals starting
execs now, not every rental ever seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BURST = 32  # execs a rental may start at once: as many sessions as it may hold (ssh_channels.py)
PER_SECOND = 4.0  # and then this many a second
KEPT = 10_000  # buckets held before the full ones are dropped


class ExecRate:
    def __init__(
        self, burst: int = BURST, per_second: float = PER_SECOND, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst, self.per_second, self._clock = burst, per_second, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # rental -> (tokens, when counted)
        self.refused = 0

    def take(self, rental_id: str) -> str | None:
        """None when the rental may start an exec now (one token taken), else why not."""
        now = self._clock()
        tokens, at = self._buckets.get(rental_id, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.per_second)
        if tokens < 1:
            self._buckets[rental_id] = (tokens, now)
            self.refused += 1
            return (
                f"too many sessions started: a rental starts at most {self.burst} at once and "
                f"{self.per_second:g} a second after; try again in a moment"
            )
        self._buckets[rental_id] = (tokens - 1, now)
        if len(self._buckets) > KEPT:
            self._drop_full(now)
        return None

    def _drop_full(self, now: float) -> None:
        self._buckets = {
            rental: (tokens, at)
            for rental, (tokens, at) in self._buckets.items()
            if tokens + (now - at) * self.per_second < self.burst
        }

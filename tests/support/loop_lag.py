"""How long an event loop was kept from running, measured from inside it: a
task asks for 5 ms sleeps and records how late each one woke."""

from __future__ import annotations

import asyncio
import time

TICK = 0.005


class LoopLag:
    """`async with LoopLag() as lag:` around the work; then `lag.gaps` (each
    wait, in seconds) and `lag.blocked(longer_than)`."""

    def __init__(self) -> None:
        self.gaps: list[float] = []
        self.elapsed = 0.0

    async def _tick(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(TICK)
            self.gaps.append(time.monotonic() - before)

    async def __aenter__(self) -> LoopLag:
        self._started = time.monotonic()
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.elapsed = time.monotonic() - self._started

    @property
    def worst(self) -> float:
        return max(self.gaps, default=self.elapsed)

    def blocked(self, longer_than: float) -> float:
        """The share of the time spent in waits longer than `longer_than`:
        near 1 when the loop runs something that long again and again, near 0
        when it stays free (a busy machine's odd late wake-up adds little)."""
        return sum(gap for gap in self.gaps if gap > longer_than) / max(self.elapsed, 1e-9)

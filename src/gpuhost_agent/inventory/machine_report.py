"""A Swarm worker's own machine, as it reports it to the leader.

The leader reports the environment to the marketplace, but only the agent on
each machine can see that machine: its GPUs through its NVML, its engine, its
toolkit's configuration, its disk, its clock. So a worker answers the leader's
`GET /gpuhost/machine` (streams/door.py) with the same systemData the
agent reports on one machine, and its GPUs' live figures. The leader judges
it against the marketplace's requirements itself (inventory/compliance.py):
the worker does not know them.

The full probe asks the engine and may start a GPU container, so it is made
when the worker starts and kept for a minute, then made again behind the
next answer (the leader asks as often as it reports, every systemDataSeconds,
5 minutes by default). The leader's heartbeats ask for the live figures
alone (`live`: one NVML pass), which never start a probe.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gpuhost_agent.inventory.system_data import Prober
from gpuhost_agent.protocol.wire_system import SystemData

FRESH_SECONDS = 60.0  # a probe younger than this answers again


class MachineReport:
    def __init__(self, prober: Prober, clock: Callable[[], float] = time.monotonic):
        self._prober, self._clock = prober, clock
        self._data: SystemData | None = None
        self._probed_at = 0.0
        self._lock = asyncio.Lock()
        self._refresh: asyncio.Task | None = None

    async def probe(self) -> SystemData:
        """A fresh probe of this machine, kept; one at a time however many ask."""
        async with self._lock:
            if self._data is None or self._clock() - self._probed_at >= FRESH_SECONDS:
                self._data = await self._prober.system_data()
                self._probed_at = self._clock()
            return self._data

    async def current(self) -> dict:
        """{"systemData": ..., "telemetry": {"gpus": [...]}} of this machine.
        Once probed, the answer never waits for a probe: a stale one is
        answered as it is and refreshed behind it (a probe may take seconds)."""
        data = self._data
        if data is None:
            data = await self.probe()
        elif self._clock() - self._probed_at >= FRESH_SECONDS and (self._refresh is None or self._refresh.done()):
            self._refresh = asyncio.create_task(self.probe())
        return {"systemData": data, **await self.live()}

    async def live(self) -> dict:
        """{"telemetry": {"gpus": [...]}}: this machine's GPUs' figures now."""
        return {"telemetry": {"gpus": await asyncio.to_thread(self._prober.nvml.telemetry)}}

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)

"""Reports the agent owes the marketplace, sent in order until acknowledged.

Only the latest report of a kind for a stack matters (a newer status or
container list replaces the older one in place, keeping its position, so a
stack's status still goes out before the completion of the job that set it).
While the marketplace is away, sending backs off exponentially with jitter and
honours Retry-After. This queue lives in memory; durability is a later step.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Awaitable, Callable

from .client import MarketplaceRejected, MarketplaceUnavailable, retry_delay
from .logs import get_logger

log = get_logger(__name__)

STATUS, CONTAINERS, JOB_COMPLETE = "status", "containers", "job"
SYSTEM_DATA, INIT_STATE = "systemData", "initState"  # one per agent: target "env"


@dataclass
class Report:
    kind: str
    target: str  # stack id, or job id for JOB_COMPLETE
    body: dict
    version: int = 0


Sender = Callable[[Report], Awaitable[None]]


class Outbox:
    def __init__(self, send: Sender, *, base_delay: float = 0.2, max_delay: float = 30.0):
        self._send = send
        self._entries: "OrderedDict[tuple[str, str], Report]" = OrderedDict()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._versions = 0
        self._base_delay = base_delay
        self._max_delay = max_delay
        self.sent = 0
        self.dropped = 0

    def put(self, kind: str, target: str, body: dict) -> None:
        self._versions += 1
        key = (kind, target)
        if key in self._entries:
            entry = self._entries[key]
            entry.body, entry.version = body, self._versions
        else:
            self._entries[key] = Report(kind, target, body, self._versions)
        self._idle.clear()
        self._wakeup.set()

    def pending(self) -> int:
        return len(self._entries)

    async def drained(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def run(self) -> None:
        failures = 0
        while True:
            if not self._entries:
                self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            key, entry = next(iter(self._entries.items()))
            version = entry.version
            try:
                await self._send(entry)
            except MarketplaceUnavailable as exc:
                failures += 1
                delay = retry_delay(failures, exc, base=self._base_delay, ceiling=self._max_delay)
                log.warning("report_deferred", kind=entry.kind, target=entry.target, error=str(exc), retry_in_s=round(delay, 2))
                await asyncio.sleep(delay)
                continue
            except MarketplaceRejected as exc:
                self.dropped += 1
                log.warning("report_rejected", kind=entry.kind, target=entry.target, error=str(exc))
            else:
                self.sent += 1
            failures = 0
            if self._entries.get(key) is entry and entry.version == version:
                del self._entries[key]

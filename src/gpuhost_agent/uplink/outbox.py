"""Reports the agent owes the marketplace, sent in order until acknowledged.

Only the latest report of a kind for a stack matters (a newer status or
container list replaces the older one in place, keeping its position, so a
stack's status still goes out before the completion of the job that set it).
While the marketplace is away, sending backs off exponentially with jitter and
honours Retry-After.

Every report is written to the state database before `put` returns and
deleted only once the marketplace acknowledged it, so a crash or a restart
loses nothing. The queue is bounded: past `max_entries` the oldest report of
the least valuable kind is dropped (container lists and host reports first:
they are snapshots the agent sends again anyway; job completions last), and
the count of dropped reports is kept and sent with every heartbeat.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.protocol.wire import REMOVED
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.client import retry_delay
from gpuhost_agent.uplink.replies import MarketplaceRejected, MarketplaceUnavailable
from gpuhost_agent.uplink.reports import (  # noqa: F401 - the kinds are named where reports are queued
    CONTAINERS,
    DROP_ORDER,
    INIT_STATE,
    JOB_COMPLETE,
    STATUS,
    SYSTEM_DATA,
    USAGE,
    Report,
)

log = get_logger(__name__)

DEFAULT_MAX_ENTRIES = 5000


Sender = Callable[[Report], Awaitable[None]]


class Outbox:
    def __init__(
        self,
        send: Sender,
        db: AgentDB,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        base_delay: float = 0.2,
        max_delay: float = 30.0,
    ):
        self._send = send
        self._db = db
        self._max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], Report] = OrderedDict()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._versions = 0
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._backoff: asyncio.Future | None = None  # the back-off sleep under way
        self.sent = 0
        self.rejected = 0  # refused by the marketplace (4xx): sending again would not help
        self.dropped = int(db.meta("reports_dropped") or "0")  # lost to the size bound
        self._seq = 0
        for kind, target, seq, body in db.outbox_entries():
            self._entries[(kind, target)] = Report(kind, target, body, 0, seq)
            self._seq = max(self._seq, seq)
        if self._entries:
            self._idle.clear()
            log.info("reports_restored", pending=len(self._entries))

    def stats(self) -> dict[str, int]:
        return {"pending": self.pending(), "sent": self.sent, "rejected": self.rejected, "dropped": self.dropped}

    def put(self, kind: str, target: str, body: dict) -> None:
        self._versions += 1
        key = (kind, target)
        entry = self._entries.get(key)
        if entry is not None:
            entry.body, entry.version = body, self._versions
        else:
            self._seq += 1
            entry = self._entries[key] = Report(kind, target, body, self._versions, self._seq)
        self._db.outbox_put(kind, target, entry.seq, body)
        if kind == STATUS and body.get("status") == REMOVED:
            self._forget((CONTAINERS, target))  # superseded: the marketplace drops a removed stack's list
        if len(self._entries) > self._max_entries:
            self._drop_one()
        self._idle.clear()
        self._wakeup.set()

    def _drop_one(self) -> None:
        for kind in DROP_ORDER:
            victim = next((key for key in self._entries if key[0] == kind), None)
            if victim is not None:
                break
        else:
            return  # every queued kind is in DROP_ORDER: not reached
        del self._entries[victim]
        self.dropped += 1
        self._db.outbox_delete(*victim)
        self._db.set_meta("reports_dropped", str(self.dropped))
        log.warning(
            "report_dropped",
            kind=victim[0],
            target=victim[1],
            dropped_total=self.dropped,
            limit=self._max_entries,
            hint="the marketplace has been unreachable for long",
        )

    def _forget(self, key: tuple[str, str]) -> None:
        if self._entries.pop(key, None) is not None:
            self._db.outbox_delete(*key)

    def pending(self) -> int:
        return len(self._entries)

    def has(self, kind: str, target: str) -> bool:
        return (kind, target) in self._entries

    def retry_now(self) -> None:
        """The marketplace answers again (a heartbeat went through): what waits
        in a back-off of up to max_delay goes now."""
        if self._backoff is not None and not self._backoff.done():
            self._backoff.cancel()

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
                log.warning(
                    "report_deferred", kind=entry.kind, target=entry.target, error=str(exc), retry_in_s=round(delay, 2)
                )
                self._backoff = asyncio.ensure_future(asyncio.sleep(delay))
                await asyncio.wait({self._backoff})  # done when slept, or cancelled by retry_now
                continue
            except MarketplaceRejected as exc:
                self.rejected += 1
                log.warning("report_rejected", kind=entry.kind, target=entry.target, error=str(exc))
            else:
                self.sent += 1
            failures = 0
            if self._entries.get(key) is entry and entry.version == version:
                del self._entries[key]
                self._db.outbox_delete(*key)

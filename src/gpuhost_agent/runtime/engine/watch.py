"""Notices the Docker Engine going away and coming back.

The agent never restarts itself for an engine restart: it pings the engine
every few seconds, logs the outage once, and when the engine answers again
calls what must be redone (reconcile, re-pushing container lists, and in time
re-attaching event and log streams). Renters' containers are the engine's
business during the outage; the agent only reports what it finds after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.protocol import wire_time
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError

log = get_logger(__name__)

OnBack = Callable[[datetime, datetime], Awaitable[None]]  # (last seen up, seen back)


class EngineWatch:
    def __init__(self, engine: DockerEngine, on_back: OnBack, *, period: float = 2.0):
        """`on_back` is what must be redone when the engine answers again
        (core/reconcile/engine_recovery.py)."""
        self.engine = engine
        self.on_back = on_back
        self.period = period
        self.up: bool | None = None
        self.last_up: datetime | None = None
        self.outages = 0
        self._following = False
        self._events_broke = asyncio.Event()
        self._follower: asyncio.Task | None = None

    def stats(self) -> dict:
        return {"up": self.up, "outages": self.outages, "lastUp": wire_time.iso(self.last_up) if self.last_up else None}

    async def run(self) -> None:
        try:
            await self._watch()
        finally:
            if self._follower is not None:
                self._follower.cancel()

    async def _watch(self) -> None:
        while True:
            await self.check()
            if self.up and not self._following:
                self._following = True
                self._follower = asyncio.create_task(self._follow(), name="docker-events-watch")
            self._events_broke.clear()
            if not self.up:  # down: look again soon, whatever the period
                await asyncio.sleep(min(self.period, 1.0))
                continue
            try:  # up: the next ping after the period, or at once when the event stream breaks
                await asyncio.wait_for(self._events_broke.wait(), self.period)
            except asyncio.TimeoutError:
                pass

    async def _follow(self) -> None:
        if await self.engine.follow_daemon_events():
            self._stream_broke()

    def _stream_broke(self) -> None:
        """dockerd went away (maybe only for a moment): the next answer counts as coming back."""
        self._following = False
        if self.up:
            self.outages += 1
            log.warning("docker_event_stream_lost", hint="the Docker Engine stopped or restarted")
        self.up = False
        self._events_broke.set()

    async def check(self) -> None:
        try:
            await self.engine.ping()
        except EngineError as exc:
            if self.up is not False:
                self.outages += 1
                log.error(
                    "docker_unreachable",
                    error=str(exc),
                    hint="waiting for the Docker Engine to come back;"
                    " renters' containers are not touched by the agent meanwhile",
                )
            self.up = False
            return
        now = wire_time.utcnow()
        came_back = self.up is False
        self.up = True
        last_up, self.last_up = self.last_up, now
        if came_back:
            log.info("docker_back", down_since=wire_time.iso(last_up) if last_up else None)
            try:
                await self.on_back(last_up or now, now)
            except Exception:  # a failing recovery must not stop the watch
                log.exception("docker_back_hook_failed")

"""Whose deploy runs now: at most `concurrency` on the host
(GPUHOST_DEPLOY_CONCURRENCY), and at most one fewer for any one rental.

A deploy may rightly hold its turn for minutes: `compose up` waits for a
service's healthcheck before starting the services that depend on it (a
model server loading its weights), up to the agent's bound on `up`. A renter
can also hold it on purpose: a service that never becomes healthy, a
dependent waiting on it, on as many stacks as there are turns. Another
renter's deploy then waited up to that bound. So no
one rental takes every turn: one is always left for the others, and a
rental's deploys beyond its share wait for its own to finish, saying so,
without holding a host's turn meanwhile. With a concurrency of 1 there is
nothing to leave.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

Waiting = Callable[[str], None]  # told why the deploy waits, once it does
Stoppable = Callable[[Awaitable[bool]], Awaitable[bool]]  # the wait, ended by the deploy's stop


def per_rental(concurrency: int) -> int:
    """The turns one rental may hold at once."""
    return max(1, concurrency - 1)


class DeployLimits:
    def __init__(self, concurrency: int):
        self.concurrency = concurrency
        self.per_rental = per_rental(concurrency)
        self._host = asyncio.Semaphore(concurrency)
        self._rentals: dict[str, asyncio.Semaphore] = {}
        self._users: Counter[str] = Counter()  # deploys of each rental waiting for or holding a turn
        self.waiting = 0  # deploys waiting for a turn now

    @contextlib.asynccontextmanager
    async def turn(self, rental_id: str, waiting: Waiting, stoppable: Stoppable) -> AsyncIterator[None]:
        """The block runs in a turn of the host's and of the rental's share."""
        own = self._rentals.setdefault(rental_id, asyncio.Semaphore(self.per_rental))
        self._users[rental_id] += 1
        rental_full = (
            f"waiting for its turn: its rental runs {self.per_rental} deploys at once at most on this host, "
            "one turn being left for other rentals (GPUHOST_DEPLOY_CONCURRENCY)"
        )
        host_full = (
            f"waiting for its turn: {self.concurrency} deploys are running on this host (GPUHOST_DEPLOY_CONCURRENCY)"
        )
        try:
            async with self._held(own, rental_full, waiting, stoppable):
                async with self._held(self._host, host_full, waiting, stoppable):
                    yield
        finally:
            self._users[rental_id] -= 1
            if not self._users[rental_id]:
                del self._users[rental_id]
                self._rentals.pop(rental_id, None)

    @contextlib.asynccontextmanager
    async def _held(
        self, slots: asyncio.Semaphore, reason: str, waiting: Waiting, stoppable: Stoppable
    ) -> AsyncIterator[None]:
        """One of `slots` for the block; `waiting` hears `reason` when none is free."""
        waits = slots.locked()
        if waits:
            waiting(reason)
        self.waiting += 1
        try:
            if waits:
                await stoppable(slots.acquire())
            else:
                await slots.acquire()  # at once: the next deploy's locked() must see it taken
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            slots.release()

"""Ends rentals on time by the host's own clock.

A rental's endDate is a promise to the host and to the next renter: its stacks
go and its GPUs are freed when it passes, whether or not the marketplace can be
reached at that moment. End dates come with every job (`rental.endDate`) and
with the desired state; they are kept in the state database, so a restart
does not forget them. The marketplace hears of the removals from the outbox
when it is back.
"""

from __future__ import annotations

import asyncio
import uuid

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.rentals.end_dates import RentalEndDates
from gpuhost_agent.core.stacks.dispatcher import JobDispatcher
from gpuhost_agent.protocol import wire, wire_jobs, wire_time
from gpuhost_agent.uplink.session import SessionState

log = get_logger(__name__)
MAX_SLEEP = 30.0  # a changed clock or a missed wake-up is caught this soon
ENDINGS_AT_ONCE = 8  # rental-end jobs the clock has in flight; the rest start as these finish


class RentalClock:
    def __init__(self, end_dates: RentalEndDates, dispatcher: JobDispatcher, ledger: GpuLedger, session: SessionState):
        self.end_dates, self.dispatcher, self.ledger, self.session = end_dates, dispatcher, ledger, session
        self.db = end_dates.db
        self.ended: list[str] = []

    def due(self) -> tuple[list[str], float | None]:
        """(rentals due now, seconds until the next one is due)."""
        now = wire_time.utcnow()
        due, wait = [], None
        for rental_id, row in self.db.rentals().items():
            if not row["end_date"] or self.ledger.has_ended(rental_id):
                continue
            left = (wire_time.parse_iso(row["end_date"]) - now).total_seconds()
            if left <= 0:
                due.append(rental_id)
            else:
                wait = left if wait is None else min(wait, left)
        return due, wait

    def start_due(self, due: list[str]) -> None:
        """Submit the ends of `due` rentals, at most ENDINGS_AT_ONCE in flight:
        each takes down stacks, and a thousand at once would take the engine."""
        env_id = self.session.env_id
        busy, ending = self.dispatcher.busy_rentals(), self.dispatcher.ending_rentals()
        in_flight = len(ending)  # ends running, not rentals merely busy with a slow deploy
        for rental_id in due:
            if in_flight >= ENDINGS_AT_ONCE or not env_id:
                return
            if rental_id not in busy:
                self._end(rental_id, env_id)
                in_flight += 1

    async def run(self) -> None:
        while True:
            due, wait = self.due()
            self.start_due(due)
            self.end_dates.changed.clear()
            timeout = MAX_SLEEP if wait is None else min(MAX_SLEEP, wait + 0.05)
            if due:  # an ending still in progress: look again soon
                timeout = min(timeout, 1.0)
            try:
                await asyncio.wait_for(self.end_dates.changed.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    def _end(self, rental_id: str, env_id: str) -> None:
        log.info("rental_end_due", rental_id=rental_id, reason="endDate passed on the host's clock")
        self.ended.append(rental_id)
        job = wire_jobs.StackJob(
            f"rental-clock-{uuid.uuid4().hex[:12]}", wire.JOB_RENTAL_END, "", rental_id, env_id, "", None
        )
        self.dispatcher.submit_internal(job)

"""The rentals' end dates, as jobs (`rental.endDate`) and the desired state give
them, kept in the state database so that a restart does not forget them.

Apart from the clock that acts on them (rental_clock.py) because two parts
write them (the job dispatcher, from every job, and reconcile, from the
desired state) and the clock reads them: each gets this object, and the clock
wakes when a date changes instead of at its next look.
"""

from __future__ import annotations

import asyncio

from gpuhost_agent.protocol import wire_time
from gpuhost_agent.storage.agent_db import AgentDB


class RentalEndDates:
    def __init__(self, db: AgentDB):
        self.db = db
        self.changed = asyncio.Event()

    def note(self, rental_id: str, end_date: str | None) -> None:
        """Record a rental's end (None: it has none); a malformed date is ignored."""
        if end_date is not None and not wire_time.is_moment(end_date):
            return
        if self.db.rental_end_date(rental_id, wire_time.iso(wire_time.parse_iso(end_date)) if end_date else None):
            self.changed.set()

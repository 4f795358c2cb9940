"""The rentals' end dates, as jobs (`rental.endDate`) and the desired state give
them, kept in the state database so that a restart does not forget them.

Apart from the clock that acts on them (rental_clock.py) because two parts
write them (the job dispatcher, from every job, and reconcile, from the
desired state) and the clock reads them: each gets this object, and the clock
wakes when a date changes instead of at its next look.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from datetime import datetime

from gpuhost_agent.protocol import wire_time
from gpuhost_agent.storage.agent_db import AgentDB


def dates_of_this_host(listed: Mapping[str, datetime | None], here: set[str]) -> list[tuple[str, str | None]]:
    """The end dates of the desired state worth recording: those of rentals with
    something on this host (`here`: its record, its containers). A rental listed
    but never here has nothing to end; recording it cost one write each, and a
    past date one rental-end job each (a hostile list of 87k: 15 s a reconcile)."""
    return [
        (rental_id, wire_time.iso(end_date) if end_date else None)
        for rental_id, end_date in sorted(listed.items())
        if rental_id in here
    ]


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

    def note_many(self, dates: Iterable[tuple[str, str | None]]) -> None:
        """Record several ends in one transaction: one sync to disk, not one each."""
        with self.db.transaction():
            for rental_id, end_date in dates:
                self.note(rental_id, end_date)

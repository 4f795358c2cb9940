"""Times on the wire: always UTC with a Z, as the marketplace's documents say, and read back
whatever offset they were written with."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime | None = None) -> str:
    """Always UTC with a Z, as the documents say, whatever offset the moment had
    (a naive moment is taken as UTC)."""
    moment = moment or utcnow()
    moment = moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def iso_from_timestamp(seconds: float) -> str:
    return iso(datetime.fromtimestamp(seconds, timezone.utc))


def parse_iso(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def is_iso(value: Any) -> bool:
    """Whether a received value is an ISO 8601 date-time (its form only: a date
    the agent acts on must also be is_moment)."""
    try:
        parse_iso(value)
        return True
    except (TypeError, ValueError, AttributeError):
        return False


# A date the agent acts on (a rental's end) outside these is none: taken in, it
# would overflow the arithmetic of every later comparison with the clock
# (9999-12-31T23:00:00-05:00 is year 10000 in UTC).
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(9000, 1, 1, tzinfo=timezone.utc)


def is_moment(value: Any) -> bool:
    """Whether a received value is an ISO 8601 date-time that turns into UTC
    and back within EARLIEST and LATEST: what passes, parse_iso and iso take
    and the clock can be compared with."""
    try:
        moment = parse_iso(value).astimezone(timezone.utc)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return False
    return EARLIEST <= moment < LATEST

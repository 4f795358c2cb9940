"""The host's GPU usage: the agent's slot reports, kept and summed into the seed's usage page.

The agent reports, per rental and 15-minute slot, each GPU's running totals
of seconds used, busy, lost (the GPU out of service) and offline (the machine
down). Keeping the largest figure seen per GPU and slot makes a report sent
twice, late or out of order harmless, so the agent may resend freely.

`summary` answers GET /environments/{envId}/usage: per day in the asked time
zone and in total, how many rentals had GPU time, the GPU-hours used and what
they earned at the listing's price per GPU-hour in force in each slot; and the
change against the period of the same length just before.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from gpuhost_agent.protocol import wire_jobs, wire_time, wire_values

SLOT_SECONDS = 900  # the agent's slots (core.usage_slots); every zone's offset is a multiple of it
FIGURES = ("seconds", "busySeconds", "lostSeconds", "offlineSeconds")
MAX_GPUS_PER_REPORT = wire_jobs.MAX_GPU_COUNT
MAX_DAYS = 366
DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")  # RFC 3339's full-date; fromisoformat takes more


def report_problem(body: Any) -> str | None:
    """Why a usage report cannot be kept, or None."""
    if not isinstance(body, dict) or not isinstance(body.get("rentalId"), str):
        return "body must be an object with rentalId (string) and slotStart (date-time)"
    if not wire_time.is_iso(body.get("slotStart")):
        return "body must be an object with rentalId (string) and slotStart (date-time)"
    start = wire_time.parse_iso(body["slotStart"]).timestamp()
    if start % SLOT_SECONDS or body.get("slotSeconds") != SLOT_SECONDS:
        return f"slotStart must be a multiple of {SLOT_SECONDS} s on the UTC epoch and slotSeconds {SLOT_SECONDS}"
    gpus = body.get("gpus")
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS_PER_REPORT:
        return f"gpus must be an array of at most {MAX_GPUS_PER_REPORT} objects"
    for index, gpu in enumerate(gpus):
        if not isinstance(gpu, dict) or not isinstance(gpu.get("uuid"), str) or not 0 < len(gpu["uuid"]) <= 128:
            return f"gpus[{index}].uuid must be a string of 1 to 128 characters"
        if not all(wire_values.is_number(gpu.get(key)) and 0 <= gpu[key] <= SLOT_SECONDS for key in FIGURES):
            return f"gpus[{index}]: {', '.join(FIGURES)} must be numbers from 0 to {SLOT_SECONDS}"
        used, busy, lost, offline = (float(gpu[key]) for key in FIGURES)
        if used + lost + offline > SLOT_SECONDS + 1 or busy > used + 0.001:
            return (
                f"gpus[{index}]: seconds, lostSeconds and offlineSeconds add up to at most the slot, "
                "and busySeconds is part of seconds"
            )
    return None


def merge(kept: dict, body: dict) -> dict:
    """A report added to what is kept for its rental and slot: per GPU and
    figure, the larger of the two."""
    gpus = dict(kept.get("gpus") or {})
    for gpu in body["gpus"]:
        before = gpus.get(gpu["uuid"], [0.0] * len(FIGURES))
        gpus[gpu["uuid"]] = [max(old, float(gpu[key])) for old, key in zip(before, FIGURES, strict=True)]
    slot = int(wire_time.parse_iso(body["slotStart"]).timestamp())
    return {"rentalId": body["rentalId"], "slot": slot, "gpus": gpus}


def record_key(body: dict) -> str:
    return f"{body['rentalId']}@{int(wire_time.parse_iso(body['slotStart']).timestamp())}"


def record_price(history: list, price: float, now: str) -> None:
    """A new price per GPU-hour from `now`. Only the last price set in a slot
    counts for it, so one set in the same slot as the one before replaces it:
    the history holds at most one price per quarter hour however often a
    host changes it."""
    slot = wire_time.parse_iso(now).timestamp() // SLOT_SECONDS
    if history and wire_time.parse_iso(history[-1][0]).timestamp() // SLOT_SECONDS == slot:
        history.pop()
    history.append([now, price])


class Prices:
    """The price per GPU-hour of a slot: the last one set before the slot
    ended (a price applies from the quarter hour it was set in; 0 before the
    first one)."""

    def __init__(self, history: list):
        self.since = [wire_time.parse_iso(since).timestamp() for since, _ in history]
        self.values = [float(value) for _, value in history]

    def of(self, slot: float) -> float:
        index = bisect_left(self.since, slot + SLOT_SECONDS) - 1
        return self.values[index] if index >= 0 else 0.0


def parse_range(query: dict, zone: ZoneInfo) -> tuple[date, date]:
    """from and to (dates, both included); by default the last 30 days."""
    today = datetime.now(zone).date()
    if not all(DATE.fullmatch(query[key]) for key in ("from", "to") if key in query):
        raise ValueError("from and to must be dates, YYYY-MM-DD")
    try:
        end = date.fromisoformat(query["to"]) if "to" in query else today
        start = date.fromisoformat(query["from"]) if "from" in query else end - timedelta(days=29)
    except ValueError:
        raise ValueError("from and to must be dates, YYYY-MM-DD") from None
    if start > end or (end - start).days >= MAX_DAYS:
        raise ValueError(f"from must not be after to, and the range at most {MAX_DAYS} days")
    return start, end


def summary(records: list[dict], history: list, start: date, end: date, zone: ZoneInfo) -> dict:
    """One pass over the records: each is put in its day (days of the asked
    zone, the period before `from` as one more bucket), whatever the range."""
    length = (end - start).days + 1
    edges = [_midnight(start - timedelta(days=length), zone)]
    edges += [_midnight(start + timedelta(days=n), zone) for n in range(length + 1)]
    buckets: list[dict[str, list[float]]] = [{} for _ in range(length + 1)]  # [0]: the period before
    prices = Prices(history)
    for record in records:
        index = bisect_right(edges, record["slot"]) - 1
        if not 0 <= index <= length:
            continue
        price = prices.of(record["slot"])
        heaps = buckets[index].setdefault(record["rentalId"], [0.0] * 5)
        for used, busy, lost, offline in record["gpus"].values():
            for position, value in enumerate((used, busy, lost, offline, used * price)):
                heaps[position] += value
    in_range: dict[str, list[float]] = {}
    for bucket in buckets[1:]:
        for rental_id, heaps in bucket.items():
            kept = in_range.setdefault(rental_id, [0.0] * 5)
            for position, value in enumerate(heaps):
                kept[position] += value
    total, before = _figures(in_range), _figures(buckets[0])
    return {
        "timezone": zone.key,
        "from": start.isoformat(),
        "to": end.isoformat(),
        "days": [{"date": (start + timedelta(days=n)).isoformat(), **_figures(buckets[n + 1])} for n in range(length)],
        "total": total,
        "percentChange": {key: _change(before[key], total[key]) for key in ("count", "hours", "earned")},
    }


def _midnight(day: date, zone: ZoneInfo) -> float:
    return datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()


def _figures(by_rental: dict[str, list[float]]) -> dict:
    """Seconds (used, busy, lost, offline, used x price) per rental, as the page's hours and money."""
    rentals: list[dict[str, Any]] = [
        {
            "rentalId": rental_id,
            "hours": round(used / 3600, 6),
            "busyHours": round(busy / 3600, 6),
            "lostHours": round(lost / 3600, 6),
            "offlineHours": round(offline / 3600, 6),
            "earned": round(earned / 3600, 4),
        }
        for rental_id, (used, busy, lost, offline, earned) in sorted(by_rental.items())
    ]
    return {
        "count": len(rentals),
        **{key: round(sum(r[key] for r in rentals), 6) for key in ("hours", "busyHours", "lostHours", "offlineHours")},
        "earned": round(sum(r["earned"] for r in rentals), 4),
        "rentals": rentals,
    }


def _change(before: float, now: float) -> float:
    """Percent change; from nothing to something is 100, nothing to nothing 0."""
    if before == 0:
        return 0.0 if now == 0 else 100.0
    return round((now - before) / before * 100, 1)

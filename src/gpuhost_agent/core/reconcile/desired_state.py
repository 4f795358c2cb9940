"""The marketplace's desired state for this machine, decoded and checked.

One bad entry must not stop reconcile for every renter of the host: an entry
that is malformed is left out and named in `problems`, and the rest is
reconciled. What it names is still *listed* (`held`): reconcile neither
removes nor redeploys it, as a broken entry says nothing reliable about it.
When an entry does not even say which stack or rental it is, the reply is
`incomplete`: nothing may then be removed as unlisted this time, since it
may be the one that broke. A stack whose template is unusable is kept (it is
still wanted) but cannot be redeployed from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from gpuhost_agent.protocol import wire, wire_jobs, wire_time, wire_values

PRESENT, ABSENT = "present", "absent"
# More stacks or rentals than one machine could ever hold (Docker's address pools
# run out at a few hundred networks): a list longer than this is not this host's,
# and reconcile goes on without it rather than work through it on every run.
MAX_LISTED = 4096
T = TypeVar("T")


@dataclass(frozen=True)
class DesiredStack:
    stack_id: str
    rental_id: str
    stack_name: str
    desired: str  # PRESENT or ABSENT (the renter asked for its removal)
    status: str  # what the marketplace shows now
    open_jobs: int  # jobs for it not yet completed: those will bring it where it should be
    template: wire_jobs.StackTemplate | None  # None when unusable


@dataclass(frozen=True)
class DesiredRental:
    rental_id: str
    status: str
    end_date: datetime | None
    gpu_count: int


@dataclass(frozen=True)
class DesiredState:
    env_id: str
    stacks: dict[str, DesiredStack]
    rentals: dict[str, DesiredRental]
    problems: tuple[str, ...] = ()  # the entries left out, and why
    held: frozenset[str] = frozenset()  # ids of stacks and rentals in those entries: listed, left alone
    incomplete: bool = False  # an entry named no id: nothing is unlisted this time


def decode(raw: Any) -> DesiredState:
    """DesiredState with its bad entries left out (named in `problems`), or
    wire_jobs.InvalidBody when the reply as a whole is not one."""
    if not isinstance(raw, dict):
        raise wire_jobs.InvalidBody("desired state must be an object")
    env_id = _id(raw, "envId", "desired state")
    stacks, rentals = raw.get("stacks"), raw.get("rentals")
    if not isinstance(stacks, list) or not isinstance(rentals, list):
        raise wire_jobs.InvalidBody("desired state needs stacks and rentals arrays")
    for kind, listed in (("stacks", stacks), ("rentals", rentals)):
        if len(listed) > MAX_LISTED:
            raise wire_jobs.InvalidBody(
                f"desired state lists {len(listed)} {kind}, more than the {MAX_LISTED} one host could hold"
            )
    problems: list[str] = []
    held: set[str] = set()
    decoded_stacks = [s for s in (_kept(_stack, e, i, "stackId", problems, held) for i, e in enumerate(stacks)) if s]
    decoded_rentals = [
        r for r in (_kept(_rental, e, i, "rentalId", problems, held) for i, e in enumerate(rentals)) if r
    ]
    incomplete = len(decoded_stacks) + len(decoded_rentals) + len(held) < len(stacks) + len(rentals)
    for kind, ids in (
        ("stack", [s.stack_id for s in decoded_stacks]),
        ("rental", [r.rental_id for r in decoded_rentals]),
    ):
        if len(set(ids)) != len(ids):
            raise wire_jobs.InvalidBody(f"desired state lists a {kind} twice")
    return DesiredState(
        env_id,
        {s.stack_id: s for s in decoded_stacks},
        {r.rental_id: r for r in decoded_rentals},
        tuple(problems),
        frozenset(held),
        incomplete,
    )


def _kept(
    decoder: Callable[[Any, int], T], entry: Any, index: int, id_key: str, problems: list[str], held: set[str]
) -> T | None:
    """The decoded entry, or None with its problem noted (and its id held, if it has one)."""
    try:
        return decoder(entry, index)
    except wire_jobs.InvalidBody as exc:
        problems.append(str(exc))
        named = entry.get(id_key) if isinstance(entry, dict) else None
        if wire_values.is_safe_id(named):
            held.add(named)
        return None


def _stack(entry: Any, index: int) -> DesiredStack:
    where = f"stacks[{index}]"
    if not isinstance(entry, dict):
        raise wire_jobs.InvalidBody(f"{where} must be an object")
    desired, status, open_jobs = entry.get("desired"), entry.get("status"), entry.get("openJobs", 0)
    if desired not in (PRESENT, ABSENT):
        raise wire_jobs.InvalidBody(f"{where}.desired must be {PRESENT!r} or {ABSENT!r}")
    if status not in wire.STACK_STATUSES:
        raise wire_jobs.InvalidBody(f"{where}.status must be one of {', '.join(wire.STACK_STATUSES)}")
    if not wire_values.is_whole(open_jobs):
        raise wire_jobs.InvalidBody(f"{where}.openJobs must be a non-negative integer")
    name = entry.get("stackName", "")
    if not isinstance(name, str):
        raise wire_jobs.InvalidBody(f"{where}.stackName must be a string")
    try:
        template = wire_jobs.validate_template(entry.get("template"))
    except wire_jobs.InvalidBody:
        template = None
    return DesiredStack(
        _id(entry, "stackId", where), _id(entry, "rentalId", where), name, desired, status, open_jobs, template
    )


def _rental(entry: Any, index: int) -> DesiredRental:
    where = f"rentals[{index}]"
    if not isinstance(entry, dict):
        raise wire_jobs.InvalidBody(f"{where} must be an object")
    status, end, gpus = entry.get("status"), entry.get("endDate"), entry.get("gpuCount", 0)
    if status not in (wire.RENTAL_ACTIVE, wire.RENTAL_COMPLETE):
        raise wire_jobs.InvalidBody(f"{where}.status must be {wire.RENTAL_ACTIVE} or {wire.RENTAL_COMPLETE}")
    if end is not None and not wire_time.is_moment(end):
        raise wire_jobs.InvalidBody(f"{where}.endDate must be an ISO 8601 date-time or null")
    if not wire_values.is_whole(gpus, wire_jobs.MAX_GPU_COUNT):
        raise wire_jobs.InvalidBody(f"{where}.gpuCount must be an integer from 0 to {wire_jobs.MAX_GPU_COUNT}")
    return DesiredRental(_id(entry, "rentalId", where), status, wire_time.parse_iso(end) if end else None, gpus)


def _id(entry: dict[str, object], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not wire_values.is_safe_id(value):
        raise wire_jobs.InvalidBody(f"{where}.{key} must be an id of letters, digits, '_', '.' and '-'")
    return value

"""What reconcile should do: a pure function of what the marketplace wants,
what Docker runs, and what the agent has on record.

Level-triggered: however the machine got here (a job delivered twice, a result
lost, a half-applied stack, a state file rebuilt, an engine restart), the plan
is computed from the current picture alone, so running it again changes
nothing once the picture is right.

Caution, in order:
- nothing is done for a stack or rental that has work in flight (a job running
  here, or a job the marketplace has not seen completed): that work will bring
  it where it should be;
- a stack that failed (ERROR) is not redeployed: the renter decides;
- a stack or rental the marketplace does not list is removed only after a
  grace period, since the list may have been fetched just before it appeared;
- only what carries the agent's labels is ever seen here, so only that can be
  removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from gpuhost_agent.core.reconcile.desired_state import ABSENT, DesiredStack, DesiredState
from gpuhost_agent.protocol import wire, wire_time
from gpuhost_agent.storage.agent_db import RentalRow, StackRow

DEPLOY, REMOVE, END_RENTAL, REPORT = "deploy", "remove", "end_rental", "report"


@dataclass(frozen=True)
class SeenStack:
    """A stack as Docker shows it: its containers' states, from their labels."""

    rental_id: str
    project: str
    states: tuple[str, ...]
    gpus: tuple[str, ...] = ()
    container_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Action:
    kind: str
    target: str  # stack id, or rental id for END_RENTAL
    rental_id: str
    why: str
    status: str = ""  # for REPORT
    error_msg: str = ""


@dataclass
class Picture:
    desired: DesiredState | None  # None: the marketplace could not be asked
    seen: dict[str, SeenStack]
    record: dict[str, StackRow]  # the agent's stacks table
    rentals: dict[str, RentalRow]  # the agent's rentals table (end_date, gpus, ended_at)
    busy_stacks: set[str] = field(default_factory=set)
    busy_rentals: set[str] = field(default_factory=set)
    reports_pending: set[str] = field(default_factory=set)  # stacks with a status report in the outbox
    restore: set[str] = field(default_factory=set)  # stacks stopped by an engine restart


def ended_rentals(picture: Picture, now: datetime) -> set[str]:
    """Rentals past their end, by the marketplace's word or by their endDate
    on the host's clock (which needs no marketplace at all)."""
    ended = {
        rental_id
        for rental_id, row in picture.rentals.items()
        if (end := row.get("end_date")) and wire_time.parse_iso(end) <= now
    }
    if picture.desired is not None:
        ended |= {
            rental.rental_id
            for rental in picture.desired.rentals.values()
            if rental.status == wire.RENTAL_COMPLETE or (rental.end_date and rental.end_date <= now)
        }
    return ended


def plan(picture: Picture, now: datetime, unlisted_since: dict[str, datetime], grace_seconds: float) -> list[Action]:
    """The actions, in order. `unlisted_since` (what was first seen unlisted,
    when) is updated in place: it is the plan's only memory."""
    actions: list[Action] = []
    ended = ended_rentals(picture, now)
    rentals_in_use = {seen.rental_id for seen in picture.seen.values()}
    for rental_id in sorted(ended - picture.busy_rentals):
        row = picture.rentals.get(rental_id) or {}
        if rental_id in rentals_in_use or (row.get("gpus") and not row.get("ended_at")):
            actions.append(Action(END_RENTAL, rental_id, rental_id, "the rental has ended"))
    if picture.desired is None:
        return actions
    for stack_id, wanted in sorted(picture.desired.stacks.items()):
        if stack_id in picture.busy_stacks or wanted.open_jobs or wanted.rental_id in ended:
            continue
        action = _stack_action(picture, stack_id, wanted)
        if action is not None:
            actions.append(action)
    actions += _unlisted(picture, ended, now, unlisted_since, grace_seconds)
    return actions


def _stack_action(picture: Picture, stack_id: str, wanted: DesiredStack) -> Action | None:
    seen = picture.seen.get(stack_id)
    rental_id = wanted.rental_id
    if wanted.desired == ABSENT:
        if seen is not None:
            return Action(REMOVE, stack_id, rental_id, "the renter removed it and its containers are still there")
        return Action(REPORT, stack_id, rental_id, "removed, but the marketplace did not hear it", wire.REMOVED)
    if wanted.status == wire.ERROR or stack_id in picture.reports_pending:
        return None
    record = picture.record.get(stack_id) or {}
    if seen is None:
        if record.get("status") == wire.ERROR:
            return Action(REPORT, stack_id, rental_id, "its failure was not heard", wire.ERROR, record["error_msg"])
        return _deploy(wanted, "wanted, and no container of it exists")
    if stack_id in picture.restore:
        return _deploy(wanted, "its containers were stopped by a Docker Engine restart")
    if "created" in seen.states:
        return _deploy(wanted, "half-applied: some containers were never started")
    if wanted.status == wire.APPLYING:
        if record.get("status") == wire.APPLIED and all(state == "running" for state in seen.states):
            return Action(REPORT, stack_id, rental_id, "applied, but the marketplace did not hear it", wire.APPLIED)
        return _deploy(wanted, "the marketplace still waits for its deploy")
    return None


def _deploy(wanted: DesiredStack, why: str) -> Action | None:
    if wanted.template is None:
        return None  # nothing to deploy it from; its job path reports the problem
    return Action(DEPLOY, wanted.stack_id, wanted.rental_id, why)


def _unlisted(
    picture: Picture, ended: set[str], now: datetime, unlisted_since: dict[str, datetime], grace_seconds: float
) -> list[Action]:
    """Stacks running here and rentals holding GPUs here that the marketplace
    does not list: removed once they stay unlisted for the grace period."""
    desired = picture.desired
    if desired is None or desired.incomplete:
        return []  # without the marketplace's whole list, nothing is unlisted
    candidates = {
        f"stack:{stack_id}": (REMOVE, stack_id, seen.rental_id)
        for stack_id, seen in picture.seen.items()
        if stack_id not in desired.stacks
        and stack_id not in desired.held
        and seen.rental_id not in desired.held
        and seen.rental_id not in ended
        and stack_id not in picture.busy_stacks
    }
    desired_rentals = {stack.rental_id for stack in desired.stacks.values()} | set(desired.rentals) | desired.held
    candidates.update(
        {
            f"rental:{rental_id}": (END_RENTAL, rental_id, rental_id)
            for rental_id, row in picture.rentals.items()
            if row.get("gpus")
            and not row.get("ended_at")
            and rental_id not in desired_rentals
            and rental_id not in ended
            and rental_id not in picture.busy_rentals
        }
    )
    for key in set(unlisted_since) - set(candidates):
        del unlisted_since[key]
    actions = []
    for key, (kind, target, rental_id) in sorted(candidates.items()):
        since = unlisted_since.setdefault(key, now)
        if (now - since).total_seconds() >= grace_seconds:
            actions.append(Action(kind, target, rental_id, "the marketplace does not list it"))
    return actions

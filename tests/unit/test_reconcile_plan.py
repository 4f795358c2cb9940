"""Reconcile's plan (a pure function of desired state, Docker and the agent's
record) and the decoder of the marketplace's desired state.

No Docker, no network: pictures are built from the dataclasses directly.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import pytest

from gpuhost_agent.core.reconcile.desired_state import (
    ABSENT,
    PRESENT,
    DesiredRental,
    DesiredStack,
    DesiredState,
    decode,
)
from gpuhost_agent.core.reconcile.plan import (
    DEPLOY,
    END_RENTAL,
    REMOVE,
    REPORT,
    Action,
    Picture,
    SeenStack,
    ended_rentals,
    plan,
)
from gpuhost_agent.protocol import wire, wire_jobs, wire_time

TEMPLATE = wire_jobs.validate_template(
    {"name": "n", "description": "d", "content": "services: {}\n", "environmentVariables": {}}
)
GRACE = 60.0
NOW = wire_time.utcnow()
PAST = NOW - timedelta(hours=1)
FUTURE = NOW + timedelta(hours=1)


# ---- builders ------------------------------------------------------------------


def stack(
    stack_id="s1", rental_id="r1", *, desired=PRESENT, status=wire.APPLYING, open_jobs=0, template=TEMPLATE, name="web"
) -> DesiredStack:
    return DesiredStack(stack_id, rental_id, name, desired, status, open_jobs, template)


def rental(rental_id="r1", *, status=wire.RENTAL_ACTIVE, end_date=None, gpu_count=1) -> DesiredRental:
    return DesiredRental(rental_id, status, end_date, gpu_count)


def desired(*items) -> DesiredState:
    stacks = {item.stack_id: item for item in items if isinstance(item, DesiredStack)}
    rentals = {item.rental_id: item for item in items if isinstance(item, DesiredRental)}
    return DesiredState("env1", stacks, rentals)


def seen(rental_id="r1", *states, project="p", gpus=()) -> SeenStack:
    return SeenStack(rental_id, project, tuple(states) or ("running",), tuple(gpus))


def record(status=wire.APPLIED, error_msg="", rental_id="r1") -> dict:
    return {"status": status, "error_msg": error_msg, "project": "p", "rental_id": rental_id}


def rental_row(end_date=None, gpus=("GPU-1",), ended_at=None) -> dict:
    return {
        "end_date": wire_time.iso(end_date) if end_date else None,
        "gpus": list(gpus),
        "ended_at": wire_time.iso(ended_at) if ended_at else None,
    }


def picture(want, *, seen_=None, record_=None, rentals_=None, **extra) -> Picture:
    return Picture(want, seen_ or {}, record_ or {}, rentals_ or {}, **extra)


def run(pic: Picture, now: datetime = NOW, unlisted: dict | None = None, grace: float = GRACE) -> list[Action]:
    return plan(pic, now, {} if unlisted is None else unlisted, grace)


def kinds(actions) -> list[tuple[str, str]]:
    return [(action.kind, action.target) for action in actions]


# ---- desired present -----------------------------------------------------------


@pytest.mark.parametrize("status", [wire.APPLYING, wire.APPLIED])
def test_wanted_stack_without_containers_is_deployed(status):
    actions = run(picture(desired(stack("s1", "r1", status=status), rental("r1"))))
    assert len(actions) == 1
    action = actions[0]
    assert (action.kind, action.target, action.rental_id) == (DEPLOY, "s1", "r1")
    assert action.why


def test_failed_stack_is_not_redeployed():
    assert run(picture(desired(stack(status=wire.ERROR), rental()))) == []
    # not even when the record says it had been applied once
    assert run(picture(desired(stack(status=wire.ERROR), rental()), record_={"s1": record(wire.APPLIED)})) == []


def test_a_failure_the_marketplace_did_not_hear_is_reported():
    pic = picture(
        desired(stack(status=wire.APPLYING), rental()), record_={"s1": record(wire.ERROR, "compose exited with 1")}
    )
    actions = run(pic)
    assert len(actions) == 1
    action = actions[0]
    assert (action.kind, action.target, action.rental_id) == (REPORT, "s1", "r1")
    assert (action.status, action.error_msg) == (wire.ERROR, "compose exited with 1")


def test_wanted_stack_with_a_record_other_than_error_is_deployed_not_reported():
    for status in (wire.APPLYING, wire.APPLIED):
        pic = picture(desired(stack(status=wire.APPLYING), rental()), record_={"s1": record(status)})
        assert kinds(run(pic)) == [(DEPLOY, "s1")]


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"open_jobs": 1}, id="open-job"),
        pytest.param({"busy_stacks": {"s1"}}, id="busy-stack"),
        pytest.param({"reports_pending": {"s1"}}, id="status-report-pending"),
    ],
)
def test_work_in_flight_means_nothing_is_done(extra):
    extra = dict(extra)
    open_jobs = extra.pop("open_jobs", 0)
    baseline = picture(desired(stack(status=wire.APPLYING), rental()))
    assert kinds(run(baseline)) == [(DEPLOY, "s1")]  # what would happen otherwise
    pic = picture(desired(stack(status=wire.APPLYING, open_jobs=open_jobs), rental()), **extra)
    assert run(pic) == []


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"open_jobs": 2}, id="open-job"),
        pytest.param({"busy_stacks": {"s1"}}, id="busy-stack"),
    ],
)
def test_work_in_flight_also_holds_back_a_removal(extra):
    extra = dict(extra)
    open_jobs = extra.pop("open_jobs", 0)
    pic = picture(
        desired(stack(desired=ABSENT, status=wire.REMOVING, open_jobs=open_jobs), rental()),
        seen_={"s1": seen("r1")},
        **extra,
    )
    assert run(pic) == []


def test_work_in_flight_on_one_stack_does_not_hold_back_another():
    pic = picture(desired(stack("s1", open_jobs=1), stack("s2"), rental()), busy_stacks={"s3"})
    assert kinds(run(pic)) == [(DEPLOY, "s2")]


def test_an_error_report_pending_is_not_reported_again():
    pic = picture(
        desired(stack(status=wire.APPLYING), rental()), record_={"s1": record(wire.ERROR, "x")}, reports_pending={"s1"}
    )
    assert run(pic) == []


# ---- desired absent ------------------------------------------------------------


def test_removed_stack_with_containers_is_removed():
    pic = picture(
        desired(stack(desired=ABSENT, status=wire.REMOVING), rental()),
        seen_={"s1": seen("r1")},
        record_={"s1": record()},
    )
    actions = run(pic)
    assert [(a.kind, a.target, a.rental_id) for a in actions] == [(REMOVE, "s1", "r1")]


def test_removed_stack_without_containers_is_reported_removed():
    pic = picture(desired(stack(desired=ABSENT, status=wire.REMOVING), rental()))
    actions = run(pic)
    assert len(actions) == 1
    assert (actions[0].kind, actions[0].target, actions[0].status) == (REPORT, "s1", wire.REMOVED)


# ---- what Docker shows ---------------------------------------------------------


@pytest.mark.parametrize("status", [wire.APPLYING, wire.APPLIED])
def test_half_applied_stack_is_deployed_again(status):
    pic = picture(
        desired(stack(status=status), rental()),
        seen_={"s1": seen("r1", "running", "created")},
        record_={"s1": record(wire.APPLIED)},
    )
    assert kinds(run(pic)) == [(DEPLOY, "s1")]


def test_applied_but_unheard_is_reported_applied():
    pic = picture(
        desired(stack(status=wire.APPLYING), rental()),
        seen_={"s1": seen("r1", "running", "running")},
        record_={"s1": record(wire.APPLIED)},
    )
    actions = run(pic)
    assert len(actions) == 1
    assert (actions[0].kind, actions[0].target, actions[0].status) == (REPORT, "s1", wire.APPLIED)


@pytest.mark.parametrize(
    "recorded, states",
    [
        (wire.APPLYING, ("running",)),  # the deploy never finished here
        (None, ("running",)),  # no record at all (a rebuilt state file)
        (wire.APPLIED, ("running", "exited")),  # applied, but not everything runs
    ],
)
def test_applying_without_a_finished_deploy_is_deployed(recorded, states):
    record_ = {"s1": record(recorded)} if recorded else {}
    pic = picture(desired(stack(status=wire.APPLYING), rental()), seen_={"s1": seen("r1", *states)}, record_=record_)
    assert kinds(run(pic)) == [(DEPLOY, "s1")]


def test_stopped_by_an_engine_restart_is_deployed_again():
    want = desired(stack(status=wire.APPLIED), rental())
    stopped = {"s1": seen("r1", "exited")}
    # exited on its own: the renter's business, nothing is done
    assert run(picture(want, seen_=stopped, record_={"s1": record()})) == []
    pic = picture(want, seen_=stopped, record_={"s1": record()}, restore={"s1"})
    assert kinds(run(pic)) == [(DEPLOY, "s1")]


def test_steady_state_plans_nothing():
    want = desired(
        stack("s1", status=wire.APPLIED),
        stack("s2", "r2", status=wire.APPLIED),
        rental("r1"),
        rental("r2", end_date=FUTURE),
    )
    pic = picture(
        want,
        seen_={"s1": seen("r1"), "s2": seen("r2")},
        record_={"s1": record(), "s2": record(rental_id="r2")},
        rentals_={"r1": rental_row(), "r2": rental_row(FUTURE)},
    )
    unlisted: dict = {}
    assert run(pic, unlisted=unlisted) == []
    assert run(pic, NOW + timedelta(seconds=10 * GRACE), unlisted) == []
    assert unlisted == {}


@pytest.mark.parametrize("setup", ["no-containers", "restore", "created", "applying"])
def test_no_deploy_without_a_usable_template(setup):
    seen_ = {"s1": seen("r1", "created" if setup == "created" else "exited")} if setup != "no-containers" else {}
    status = wire.APPLYING if setup in ("no-containers", "applying") else wire.APPLIED
    extra = {"restore": {"s1"}} if setup == "restore" else {}
    with_template = picture(desired(stack(status=status), rental()), seen_=seen_, **extra)
    assert kinds(run(with_template)) == [(DEPLOY, "s1")]
    without = picture(desired(stack(status=status, template=None), rental()), seen_=seen_, **extra)
    assert run(without) == []


def test_actions_come_in_stack_order():
    pic = picture(
        desired(stack("s3"), stack("s1"), stack("s2", desired=ABSENT, status=wire.REMOVING), rental()),
        seen_={"s2": seen("r1")},
    )
    assert kinds(run(pic)) == [(DEPLOY, "s1"), (REMOVE, "s2"), (DEPLOY, "s3")]


# ---- unlisted stacks and rentals -------------------------------------------------


def test_unlisted_stack_is_removed_only_after_the_grace_period():
    want = desired(rental("r1"))
    pic = picture(want, seen_={"s9": seen("r9")})
    unlisted: dict = {}
    assert run(pic, NOW, unlisted) == []
    assert unlisted == {"stack:s9": NOW}
    assert run(pic, NOW + timedelta(seconds=GRACE - 1), unlisted) == []
    assert unlisted == {"stack:s9": NOW}  # the first sighting is kept
    actions = run(pic, NOW + timedelta(seconds=GRACE), unlisted)
    assert [(a.kind, a.target, a.rental_id) for a in actions] == [(REMOVE, "s9", "r9")]


def test_a_stack_listed_again_is_forgotten_and_its_grace_starts_over():
    unlisted: dict = {}
    unlisted_pic = picture(desired(), seen_={"s9": seen("r9")}, record_={"s9": record(rental_id="r9")})
    assert run(unlisted_pic, NOW, unlisted) == []
    assert "stack:s9" in unlisted
    listed = picture(
        desired(stack("s9", "r9", status=wire.APPLIED), rental("r9")),
        seen_={"s9": seen("r9")},
        record_={"s9": record(rental_id="r9")},
    )
    later = NOW + timedelta(seconds=GRACE / 2)
    assert run(listed, later, unlisted) == []
    assert unlisted == {}
    # unlisted again: counted from now, not from the first time
    assert run(unlisted_pic, NOW + timedelta(seconds=GRACE), unlisted) == []
    assert unlisted == {"stack:s9": NOW + timedelta(seconds=GRACE)}
    assert kinds(run(unlisted_pic, NOW + timedelta(seconds=2 * GRACE), unlisted)) == [(REMOVE, "s9")]


def test_a_busy_unlisted_stack_is_left_alone():
    pic = picture(desired(), seen_={"s9": seen("r9")}, busy_stacks={"s9"})
    unlisted: dict = {}
    assert run(pic, NOW, unlisted) == []
    assert run(pic, NOW + timedelta(seconds=10 * GRACE), unlisted) == []


def test_rental_holding_gpus_that_nothing_lists_is_ended_after_the_grace_period():
    pic = picture(desired(), rentals_={"r9": rental_row(gpus=["GPU-1"])})
    unlisted: dict = {}
    assert run(pic, NOW, unlisted) == []
    assert unlisted == {"rental:r9": NOW}
    assert run(pic, NOW + timedelta(seconds=GRACE - 1), unlisted) == []
    actions = run(pic, NOW + timedelta(seconds=GRACE), unlisted)
    assert [(a.kind, a.target, a.rental_id) for a in actions] == [(END_RENTAL, "r9", "r9")]


@pytest.mark.parametrize("case", ["listed-rental", "stack-of-it-listed", "already-ended", "no-gpus", "busy"])
def test_listed_or_released_rentals_are_not_ended_as_unlisted(case):
    row = rental_row(gpus=[] if case == "no-gpus" else ["GPU-1"], ended_at=PAST if case == "already-ended" else None)
    items = []
    if case == "listed-rental":
        items.append(rental("r9"))
    if case == "stack-of-it-listed":
        items.append(stack("s9", "r9", status=wire.ERROR))
    pic = picture(desired(*items), rentals_={"r9": row}, busy_rentals={"r9"} if case == "busy" else set())
    unlisted: dict = {}
    assert run(pic, NOW, unlisted) == []
    assert run(pic, NOW + timedelta(seconds=10 * GRACE), unlisted) == []


# ---- ended rentals -------------------------------------------------------------


def test_ended_rentals_by_every_rule():
    pic = picture(
        desired(
            rental("done", status=wire.RENTAL_COMPLETE),
            rental("expired", end_date=PAST),
            rental("active", end_date=FUTURE),
            rental("open"),
        ),
        rentals_={"clock": rental_row(PAST), "later": rental_row(FUTURE), "none": rental_row(None)},
    )
    assert ended_rentals(pic, NOW) == {"done", "expired", "clock"}
    # the host's clock is enough without the marketplace
    assert ended_rentals(picture(None, rentals_=pic.rentals), NOW) == {"clock"}
    # exactly at the end date it has ended
    assert ended_rentals(picture(desired(rental("edge", end_date=NOW))), NOW) == {"edge"}


@pytest.mark.parametrize("how", ["complete", "desired-end-date", "record-end-date", "record-end-date-no-desired"])
@pytest.mark.parametrize("holds", ["containers", "gpus"])
def test_ended_rental_with_something_left_is_ended(how, holds):
    items = [
        rental("r1", status=wire.RENTAL_COMPLETE)
        if how == "complete"
        else rental("r1", end_date=PAST if how == "desired-end-date" else None)
    ]
    row = rental_row(PAST if how.startswith("record") else None, gpus=["GPU-1"] if holds == "gpus" else [])
    want = None if how == "record-end-date-no-desired" else desired(*items)
    seen_ = {"s1": seen("r1")} if holds == "containers" else {}
    pic = picture(want, seen_=seen_, rentals_={"r1": row})
    actions = run(pic)  # no grace: the rental's end is known
    assert [(a.kind, a.target, a.rental_id) for a in actions] == [(END_RENTAL, "r1", "r1")]
    # busy: the job doing it will finish it
    pic.busy_rentals = {"r1"}
    assert run(pic) == []


def test_ended_rental_with_nothing_left_is_not_ended_again():
    row = rental_row(PAST, gpus=[], ended_at=PAST)
    assert run(picture(desired(rental("r1", status=wire.RENTAL_COMPLETE)), rentals_={"r1": row})) == []
    assert run(picture(None, rentals_={"r1": row})) == []
    # GPUs on record but already released (ended_at set): nothing either
    released = rental_row(PAST, gpus=["GPU-1"], ended_at=PAST)
    assert run(picture(None, rentals_={"r1": released})) == []
    # but containers still running are ended whatever the record says
    assert kinds(run(picture(None, seen_={"s1": seen("r1")}, rentals_={"r1": released}))) == [(END_RENTAL, "r1")]


def test_rental_before_its_end_date_is_not_ended():
    pic = picture(None, seen_={"s1": seen("r1")}, rentals_={"r1": rental_row(FUTURE)})
    assert run(pic) == []
    assert kinds(run(pic, FUTURE + timedelta(seconds=1))) == [(END_RENTAL, "r1")]


def test_without_desired_state_only_rentals_are_ended():
    pic = picture(
        None,
        seen_={"s1": seen("r1"), "s9": seen("r9", "created"), "s8": seen("r8")},
        record_={"s1": record(), "s9": record(wire.ERROR, "x", "r9")},
        rentals_={"r1": rental_row(PAST), "r7": rental_row(None, gpus=["GPU-7"])},
    )
    unlisted = {"stack:s8": NOW - timedelta(days=1)}
    before = dict(unlisted)
    for now in (NOW, NOW + timedelta(seconds=10 * GRACE)):
        actions = run(pic, now, unlisted)
        assert {a.kind for a in actions} == {END_RENTAL}
        assert kinds(actions) == [(END_RENTAL, "r1")]
    assert unlisted == before  # nothing learned about listing from no list


def test_stacks_of_an_ended_rental_get_no_stack_actions():
    want = desired(
        rental("r1", status=wire.RENTAL_COMPLETE),
        stack("s1", "r1", status=wire.APPLYING),  # would be deployed
        stack("s2", "r1", desired=ABSENT, status=wire.REMOVING),  # would be removed
        stack("s3", "r1", desired=ABSENT, status=wire.REMOVING),  # would be reported
        stack("s4", "r1", status=wire.APPLYING),
    )  # would be reported applied
    pic = picture(
        want,
        seen_={"s2": seen("r1"), "s4": seen("r1"), "s5": seen("r1")},  # s5 unlisted
        record_={"s4": record(wire.APPLIED)},
        rentals_={"r1": rental_row(None)},
    )
    unlisted: dict = {}
    assert kinds(run(pic, NOW, unlisted)) == [(END_RENTAL, "r1")]
    assert kinds(run(pic, NOW + timedelta(seconds=10 * GRACE), unlisted)) == [(END_RENTAL, "r1")]
    # the same stacks of an active rental do get them (so the above is not vacuous)
    active = copy.deepcopy(pic)
    active.desired = DesiredState("env1", want.stacks, {"r1": rental("r1")})
    assert sorted(kinds(run(active, NOW + timedelta(seconds=10 * GRACE), {"stack:s5": NOW}))) == [
        (DEPLOY, "s1"),
        (REMOVE, "s2"),
        (REMOVE, "s5"),
        (REPORT, "s3"),
        (REPORT, "s4"),
    ]


def test_ended_rentals_come_first_and_one_action_per_rental():
    pic = picture(
        desired(stack("a1", "r3"), rental("r2", status=wire.RENTAL_COMPLETE), rental("r3")),
        seen_={"x1": seen("r2"), "x2": seen("r2"), "y": seen("r1")},
        rentals_={"r1": rental_row(PAST, gpus=["GPU-1"]), "r2": rental_row(None, gpus=["GPU-2"])},
    )
    assert kinds(run(pic)) == [(END_RENTAL, "r1"), (END_RENTAL, "r2"), (DEPLOY, "a1")]


# ---- decode --------------------------------------------------------------------

RAW_TEMPLATE = {"name": "n", "description": "d", "content": "services: {}\n", "environmentVariables": {"A": "1"}}


def valid_body() -> dict:
    return {
        "envId": "env-1",
        "stacks": [
            {
                "stackId": "s1",
                "rentalId": "r1",
                "stackName": "web",
                "desired": "present",
                "status": "APPLIED",
                "openJobs": 2,
                "template": copy.deepcopy(RAW_TEMPLATE),
            },
            {"stackId": "s2", "rentalId": "r1", "desired": "absent", "status": "REMOVING"},
        ],
        "rentals": [
            {"rentalId": "r1", "status": "ACTIVE", "endDate": "2030-01-02T03:04:05Z", "gpuCount": 2},
            {"rentalId": "r2", "status": "COMPLETE", "endDate": None},
        ],
    }


def test_decode_a_valid_reply():
    state = decode(valid_body())
    assert state.env_id == "env-1"
    assert set(state.stacks) == {"s1", "s2"} and set(state.rentals) == {"r1", "r2"}
    s1, s2 = state.stacks["s1"], state.stacks["s2"]
    assert s1 == DesiredStack("s1", "r1", "web", PRESENT, wire.APPLIED, 2, wire_jobs.validate_template(RAW_TEMPLATE))
    assert s1.template["environmentVariables"] == {"A": "1"} and s1.template["insecure"] is False
    assert (s2.stack_name, s2.desired, s2.status, s2.open_jobs) == ("", ABSENT, wire.REMOVING, 0)
    assert s2.template is None  # no template: kept, but cannot be redeployed
    r1, r2 = state.rentals["r1"], state.rentals["r2"]
    assert r1 == DesiredRental("r1", wire.RENTAL_ACTIVE, datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc), 2)
    assert r1.end_date.tzinfo is not None
    assert r2 == DesiredRental("r2", wire.RENTAL_COMPLETE, None, 0)


def test_decode_an_empty_reply():
    state = decode({"envId": "e", "stacks": [], "rentals": []})
    assert state == DesiredState("e", {}, {})


def _set(path, value):
    def mutate(body):
        target = body
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return body

    return mutate


def _delete(path):
    def mutate(body):
        target = body
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return body

    return mutate


def _replace(value):
    return lambda body: value


MALFORMED = {
    "not-an-object-list": _replace([]),
    "not-an-object-string": _replace("stacks"),
    "not-an-object-none": _replace(None),
    "not-an-object-number": _replace(3),
    "missing-stacks": _delete(["stacks"]),
    "missing-rentals": _delete(["rentals"]),
    "stacks-not-array": _set(["stacks"], {"s1": {}}),
    "rentals-not-array": _set(["rentals"], None),
    "missing-env-id": _delete(["envId"]),
    "bad-env-id-slash": _set(["envId"], "../etc"),
    "bad-env-id-empty": _set(["envId"], ""),
    "bad-env-id-number": _set(["envId"], 7),
    "bad-env-id-leading-dot": _set(["envId"], ".hidden"),
    "stack-not-object": _set(["stacks", 1], "s2"),
    "stack-missing-id": _delete(["stacks", 0, "stackId"]),
    "bad-stack-id": _set(["stacks", 1, "stackId"], "a/b"),
    "bad-stack-id-space": _set(["stacks", 1, "stackId"], "a b"),
    "bad-stack-id-too-long": _set(["stacks", 1, "stackId"], "a" * 129),
    "bad-stack-rental-id": _set(["stacks", 0, "rentalId"], None),
    "bad-desired": _set(["stacks", 0, "desired"], "maybe"),
    "missing-desired": _delete(["stacks", 0, "desired"]),
    "bad-desired-case": _set(["stacks", 0, "desired"], "PRESENT"),
    "bad-status": _set(["stacks", 0, "status"], "RUNNING"),
    "status-removed-not-a-stack-status": _set(["stacks", 0, "status"], "REMOVED"),
    "missing-status": _delete(["stacks", 1, "status"]),
    "status-lowercase": _set(["stacks", 0, "status"], "applied"),
    "negative-open-jobs": _set(["stacks", 0, "openJobs"], -1),
    "bool-open-jobs": _set(["stacks", 0, "openJobs"], True),
    "float-open-jobs": _set(["stacks", 0, "openJobs"], 1.0),
    "string-open-jobs": _set(["stacks", 0, "openJobs"], "1"),
    "null-open-jobs": _set(["stacks", 0, "openJobs"], None),
    "bad-stack-name": _set(["stacks", 0, "stackName"], 5),
    "rental-not-object": _set(["rentals", 0], ["r1"]),
    "bad-rental-id": _set(["rentals", 1, "rentalId"], "r 2"),
    "missing-rental-id": _delete(["rentals", 0, "rentalId"]),
    "bad-rental-status": _set(["rentals", 0, "status"], "ENDED"),
    "missing-rental-status": _delete(["rentals", 0, "status"]),
    "bad-end-date-word": _set(["rentals", 0, "endDate"], "tomorrow"),
    "bad-end-date-number": _set(["rentals", 0, "endDate"], 1700000000),
    "bad-end-date-empty": _set(["rentals", 0, "endDate"], ""),
    "bad-end-date-object": _set(["rentals", 0, "endDate"], {"at": "2030-01-01"}),
    "negative-gpu-count": _set(["rentals", 0, "gpuCount"], -1),
    "bool-gpu-count": _set(["rentals", 0, "gpuCount"], True),
    "string-gpu-count": _set(["rentals", 0, "gpuCount"], "2"),
    "float-gpu-count": _set(["rentals", 0, "gpuCount"], 2.5),
    "null-gpu-count": _set(["rentals", 0, "gpuCount"], None),
}


WHOLE = ("not-an-object", "missing-stacks", "missing-rentals", "stacks-not-array", "rentals-not-array", "env-id")


def _whole(case: str) -> bool:
    """Cases where the reply as a whole is not a desired state (else one entry is bad)."""
    return case.startswith(WHOLE) or "env-id" in case


@pytest.mark.parametrize("case", [c for c in MALFORMED if _whole(c)])
def test_decode_refuses_a_reply_that_is_not_a_desired_state(case):
    with pytest.raises(wire_jobs.InvalidBody):
        decode(MALFORMED[case](valid_body()))


@pytest.mark.parametrize("case", [c for c in MALFORMED if not _whole(c)])
def test_one_malformed_entry_is_left_out_named_and_the_rest_kept(case):
    """One bad rental (gpuCount 39345733090013528) stopped reconcile
    for every renter of the host. The entry is left out and named; what it
    names is held (neither removed nor redeployed); an entry without an id of
    its own makes the list incomplete (nothing is removed as unlisted)."""
    state = decode(MALFORMED[case](valid_body()))
    assert len(state.problems) == 1 and ("stacks[" in state.problems[0] or "rentals[" in state.problems[0])
    entries = len(state.stacks) + len(state.rentals)
    assert entries == 3  # the other three of the four entries are there
    assert state.incomplete or len(state.held) == 1


def test_a_bad_entry_at_the_end_is_left_out_and_what_it_names_is_held():
    body = valid_body()
    body["stacks"].append(
        {"stackId": "s3", "rentalId": "r1", "desired": "present", "status": "APPLIED", "openJobs": -5}
    )
    body["rentals"].append({"rentalId": "r3", "status": "ACTIVE", "gpuCount": 39345733090013528})
    state = decode(body)
    assert set(state.stacks) == {"s1", "s2"} and set(state.rentals) == {"r1", "r2"}
    assert state.held == {"s3", "r3"} and not state.incomplete
    assert [p.split(" ")[0] for p in state.problems] == ["stacks[2].openJobs", "rentals[2].gpuCount"]


def test_what_a_bad_entry_names_is_neither_removed_nor_redeployed_and_an_incomplete_list_removes_nothing():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    seen = {"held-stack": SeenStack("r1", "p", ("running",)), "of-held-rental": SeenStack("r9", "q", ("running",))}
    since = {"stack:held-stack": now - timedelta(hours=1), "stack:of-held-rental": now - timedelta(hours=1)}
    held = DesiredState("env-1", {}, {}, ("stacks[0].status ...",), frozenset({"held-stack", "r9"}))
    assert plan(Picture(held, seen, {}, {}), now, dict(since), 0) == []
    incomplete = DesiredState("env-1", {}, {}, ("stacks[0] must be an object",), frozenset(), True)
    assert plan(Picture(incomplete, seen, {}, {}), now, dict(since), 0) == []
    whole = DesiredState("env-1", {}, {})
    assert {a.target for a in plan(Picture(whole, seen, {}, {}), now, dict(since), 0)} == {
        "held-stack",
        "of-held-rental",
    }  # listed nowhere: removed (the check that the two above could fail)


@pytest.mark.parametrize("where", ["envId", "stackId", "stack-rentalId", "rentalId"])
def test_an_id_with_a_trailing_newline_is_refused(where):
    body = valid_body()
    if where == "envId":
        body["envId"] = "env-1\n"
        with pytest.raises(wire_jobs.InvalidBody):
            decode(body)
        return
    if where == "stackId":
        body["stacks"][0]["stackId"] = "s1\n"
    elif where == "stack-rentalId":
        body["stacks"][0]["rentalId"] = "r1\n"
    else:
        body["rentals"][0]["rentalId"] = "r1\n"
    state = decode(body)
    assert state.problems and "s1\n" not in state.stacks and "r1\n" not in state.rentals


def test_decode_leaves_out_a_rental_with_a_gpu_count_no_host_has():
    body = valid_body()
    body["rentals"][0]["gpuCount"] = wire_jobs.MAX_GPU_COUNT + 1
    state = decode(body)
    assert "r1" not in state.rentals and "r1" in state.held


def test_decode_accepts_the_largest_gpu_count():
    body = valid_body()
    body["rentals"][0]["gpuCount"] = wire_jobs.MAX_GPU_COUNT
    assert decode(body).rentals["r1"].gpu_count == wire_jobs.MAX_GPU_COUNT


@pytest.mark.parametrize(
    "template",
    [
        pytest.param("services: {}", id="a-string"),
        pytest.param(["x"], id="a-list"),
        pytest.param({"name": "n"}, id="missing-fields"),
        pytest.param({**RAW_TEMPLATE, "name": "  "}, id="empty-name"),
        pytest.param({**RAW_TEMPLATE, "environmentVariables": {"A": 1}}, id="non-string-variable"),
        pytest.param({**RAW_TEMPLATE, "insecure": "yes"}, id="non-bool-flag"),
    ],
)
def test_an_unusable_template_is_dropped_without_refusing_the_reply(template):
    body = valid_body()
    body["stacks"][0]["template"] = template
    state = decode(body)
    s1 = state.stacks["s1"]
    assert s1.template is None
    # the rest of the stack and of the reply is intact
    assert (s1.stack_id, s1.rental_id, s1.desired, s1.status, s1.open_jobs) == ("s1", "r1", PRESENT, wire.APPLIED, 2)
    assert set(state.stacks) == {"s1", "s2"} and set(state.rentals) == {"r1", "r2"}
    # and plan then does not deploy it
    want = DesiredState(state.env_id, {"s1": s1}, state.rentals)
    assert run(picture(want)) == []


def test_a_decoded_reply_plans_as_expected():
    body = valid_body()
    body["stacks"][0]["openJobs"] = 0
    state = decode(body)
    assert kinds(run(picture(state))) == [(DEPLOY, "s1"), (REPORT, "s2")]

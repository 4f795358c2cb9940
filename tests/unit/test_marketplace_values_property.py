"""Hostile values in the marketplace's session and heartbeat replies:
whatever a reply holds, its decoders give values the agent's loops can
use (intervals within their bounds, requirements, a release offer or a reason),
never an exception; and a real scheduler takes the widest interval they allow.
(Jobs and the desired state: test_decoders_property.py and test_bad_input.py.)
"""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from support.doc_reporter import session_reporter
from test_decoders_property import FAST, dates, json_values

from gpuhost_agent.core import schedule as schedule_module
from gpuhost_agent.core.reconcile import desired_state
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import intervals as wire_intervals
from gpuhost_agent.protocol import wire, wire_jobs, wire_release, wire_time
from gpuhost_agent.protocol.requirements import Requirements, version_tuple

# Numbers as a marketplace may send them (JSON has no NaN: the client refuses those).
numbers = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 0.001, 1e12, 1e308, -1, 10**400, 2**63]),
)
interval_values = st.one_of(numbers, json_values)
replies = (
    st.dictionaries(st.sampled_from([*wire_intervals.DEFAULT_INTERVALS, "x"]), interval_values, max_size=8)
    | json_values
)


def _within_bounds(intervals: dict[str, float]) -> None:
    assert set(intervals) == set(wire_intervals.DEFAULT_INTERVALS)
    for name, value in intervals.items():
        low, high = wire_intervals.BOUNDS[name]
        assert type(value) is float and math.isfinite(value) and low <= value <= high, (name, value)


@FAST
@given(replies)
def test_intervals_of_any_reply_are_within_their_bounds(raw):
    _within_bounds(wire_intervals.from_reply(raw))
    said = wire_intervals.problems(raw)
    assert all(isinstance(line, str) and len(line) < 200 for line in said)


@pytest.mark.parametrize(
    ("value", "expected"), [(1e12, 3600.0), (0.001, 0.1), (10**400, 3600.0), (-5, 0.1), ("30", 30.0), (True, 30.0)]
)
def test_an_interval_out_of_bounds_is_held_to_them_and_said(value, expected):
    assert wire_intervals.from_reply({"heartbeatSeconds": value})["heartbeatSeconds"] == expected
    assert wire_intervals.problems({"heartbeatSeconds": value}), "said in the log"


async def test_the_scheduler_takes_the_widest_and_narrowest_intervals():
    """1e12 s overflowed APScheduler at start; the bounds never give it more than it can hold."""
    schedule = schedule_module.Schedule()
    schedule.start()
    try:
        for name, (low, high) in wire_intervals.BOUNDS.items():

            async def work() -> None:
                pass

            schedule.every(f"{name}-high", high, work)
            schedule.every(f"{name}-low", low, work, now=True)
        await asyncio.sleep(0.05)
    finally:
        schedule.stop()


@FAST
@given(json_values)
def test_requirements_of_any_reply_are_requirements(raw):
    required = Requirements.from_wire(raw)
    assert all(version_tuple(getattr(required, name)) for name in ("minDriverVersion", "minDockerVersion"))


def test_requirements_that_are_not_an_object_or_a_version_are_the_defaults():
    assert Requirements.from_wire([1]) == Requirements()  # AttributeError before
    assert Requirements.from_wire({"minDockerVersion": "9" * 5000}) == Requirements()  # ValueError before
    assert version_tuple("9" * 5000) == () and version_tuple("1." * 20 + "1") == ()
    assert version_tuple("v2.29.1-desktop.1") == (2, 29, 1) and version_tuple("550.54.15") == (550, 54, 15)


@FAST
@given(json_values)
def test_a_release_offer_of_any_reply_is_an_offer_a_reason_or_none(raw):
    offer = wire_release.decode_offer(raw)
    assert offer is None or isinstance(offer, (str, wire_release.ReleaseOffer))


def test_a_release_offer_with_a_trailing_newline_is_refused():
    good = {"version": "0.2.0", "path": "/agent/releases/gpuhost_agent-0.2.0-py3-none-any.whl", "size": 10}
    good["sha256"] = "a" * 64
    assert isinstance(wire_release.decode_offer(good), wire_release.ReleaseOffer)
    for key in ("version", "path", "sha256"):
        assert isinstance(wire_release.decode_offer({**good, key: good[key] + "\n"}), str), key


@FAST
@given(dates)
def test_a_date_the_agent_takes_turns_into_utc_and_back(text):
    if wire_time.is_moment(text):
        moment = wire_time.parse_iso(text)
        assert wire_time.parse_iso(wire_time.iso(moment)) == moment
        assert wire_time.EARLIEST <= moment < wire_time.LATEST


def test_a_date_past_the_year_9000_in_utc_is_no_date():
    assert not wire_time.is_moment("9999-12-31T23:00:00-05:00")  # year 10000 in UTC: OverflowError before
    assert not wire_time.is_moment("9999-12-31T23:59:59Z") and not wire_time.is_moment("0001-01-01T00:00:00+05:00")
    assert wire_time.is_moment("2026-12-31T23:00:00-05:00") and wire_time.is_iso("0071-10-20T13:52:45Z")


@FAST
@given(st.dictionaries(st.sampled_from(["heartbeatIntervalSeconds", "serverTime", "agentRelease"]), interval_values))
def test_the_heartbeat_takes_any_reply(reply):
    """The reporter's beat with a reply of anything: no exception, and the interval it keeps is within bounds."""
    state = MarketplaceState(Store.load_or_create(None))
    reporter, _outbox, client = session_reporter(state, {})

    async def hostile(_body: dict) -> dict:
        return reply

    client.heartbeat = hostile  # type: ignore[method-assign]
    asyncio.run(reporter.beat())
    _within_bounds(reporter.intervals)


rentals = st.fixed_dictionaries(
    {"rentalId": st.sampled_from(["r1", "r2", "../x"]), "status": st.sampled_from([wire.RENTAL_ACTIVE, 7])},
    optional={"endDate": st.one_of(dates, dates, json_values), "gpuCount": st.one_of(numbers, st.just(1))},
)
desired = st.fixed_dictionaries(
    {
        "envId": st.sampled_from(["e1", "e1", None]),
        "stacks": st.lists(json_values, max_size=2),
        "rentals": st.lists(st.one_of(rentals, rentals, json_values), max_size=4),
    }  # fmt: skip
)
YEAR_10000 = {
    "envId": "e1",
    "stacks": [],
    "rentals": [{"rentalId": "r1", "status": wire.RENTAL_ACTIVE, "endDate": "9999-12-31T23:00:00-05:00"}],
}


@FAST
@example(YEAR_10000)
@given(st.one_of(desired, json_values))
def test_the_desired_state_of_any_reply_is_decoded_or_refused_and_its_dates_meet_the_clock(raw):
    """Reconcile's input: a reply is a desired state (its bad entries left out) or InvalidBody,
    and every end date kept can be compared with the clock (year 10000 failed every reconcile)."""
    try:
        state = desired_state.decode(raw)
    except wire_jobs.InvalidBody:
        return
    now = wire_time.utcnow()
    for rental in state.rentals.values():
        if rental.end_date is not None:
            assert isinstance(rental.end_date <= now, bool)
            assert wire_time.parse_iso(wire_time.iso(rental.end_date)) == rental.end_date  # as reconcile records it

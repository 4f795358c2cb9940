"""Container state pushed on change, the decisions: shaping Docker's list,
coalescing events per stack, when a stopped container sets or clears the stack's
errorMsg; the watcher on a stand-in engine. (On the real engine:
tests/integration/test_container_events_engine.py.)"""

from __future__ import annotations

import asyncio

from support.fakes import FakeDispatcher, FakeEngine, FakeReporter
from support.waiting import until

from gpuhost_agent.core.containers.coalesce import Coalescer
from gpuhost_agent.core.containers.events import decode_event, error_to_report, list_behind
from gpuhost_agent.core.containers.states import ContainerStates
from gpuhost_agent.core.containers.watch import ContainerWatch
from gpuhost_agent.core.stacks.container_list import (
    ExitFacts,
    exit_facts,
    failed_containers,
    seed_containers,
    shaped_state,
    stack_error,
    stop_reason,
)
from gpuhost_agent.inventory.machines import OneMachine
from gpuhost_agent.protocol import wire
from gpuhost_agent.storage.agent_db import AgentDB


def _raw(state: str, status: str = "", *, service: str = "web", cid: str = "c1") -> dict:
    return {
        "Id": cid,
        "Names": [f"/p-{service}-1"],
        "State": state,
        "Status": status,
        "Created": 1,
        "Labels": {"com.docker.compose.service": service},
        "Ports": [],
    }


# --- pure: shaping ----------------------------------------------------------------


def test_running_stays_running_and_stopped_says_why():
    assert shaped_state(_raw("running", "Up 3 seconds")) == "running"
    assert shaped_state(_raw("exited", "Exited (0) 2 seconds ago")) == "exited (0)"
    assert shaped_state(_raw("exited", "Exited (137) 1 second ago"), ExitFacts(137, True)) == "exited (137, OOM-killed)"
    assert shaped_state(_raw("restarting", "Restarting (1) Less than a second ago")) == "restarting (1)"
    assert shaped_state(_raw("exited", "Exited (2) 1 minute ago"), ExitFacts(None, False)) == "exited (2)"
    assert shaped_state(_raw("exited", "")) == "exited"  # nothing known: Docker's word alone
    for state in ("dead", "created", "paused", "removing"):
        assert shaped_state(_raw(state, "whatever (5)")) == state
    assert exit_facts({"ExitCode": 137, "OOMKilled": True, "Running": False}) == ExitFacts(137, True)
    assert [
        c["State"] for c in seed_containers([_raw("exited", "Exited (9) now", cid="x")], {"x": ExitFacts(9, True)})
    ] == ["exited (9, OOM-killed)"]


def test_stack_error_names_stopped_services():
    assert stack_error([_raw("running"), _raw("paused", service="db"), _raw("created", service="c")]) == ""
    oom = _raw("exited", "Exited (137) now", cid="a")
    assert stack_error([oom], {"a": ExitFacts(137, True)}) == "container web exited with code 137 (OOM-killed)"
    assert (
        stack_error([_raw("dead", service="db"), _raw("restarting", "Restarting (1) now", service="api")])
        == "container api is restarting: it exited with code 1; container db is dead"
    )
    healthy, starting = _raw("running", "Up 2 minutes (healthy)"), _raw("running", "Up 1 second (health: starting)")
    assert stack_error([healthy, starting]) == ""
    done = _raw("exited", "Exited (0) 3 seconds ago", service="import", cid="d")
    assert stack_error([done]) == "" and failed_containers([done]) == []  # a one-shot that completed
    assert stack_error([done], {"d": ExitFacts(0, True)}) == "container import exited with code 0 (OOM-killed)"
    assert failed_containers([_raw("exited", "Exited (1) now")]) != []
    sick = _raw("running", "Up 2 minutes (unhealthy)", service="llm")
    assert shaped_state(sick) == "running (unhealthy)"
    assert stack_error([sick]) == "container llm is running but unhealthy (its healthcheck fails)"
    many = [_raw("exited", "Exited (1) now", service=f"s{i}", cid=str(i)) for i in range(5)]
    assert stack_error(many).endswith("; and 2 more stopped") and stack_error(many).count("container ") == 3


# --- pure: decisions ----------------------------------------------------------------


def test_coalescer_gives_one_flush_per_window():
    windows = Coalescer()
    assert windows.event("s") is True
    assert not any(windows.event("s") for _ in range(999))  # the burst joins the open window
    windows.begin("s")
    assert windows.end("s") is False and windows.pending() == set()
    assert windows.event("s") is True
    windows.begin("s")
    assert windows.event("s") is False  # during the flush: remembered...
    assert windows.end("s") is True  # ...and one more window follows
    windows.begin("s")
    assert windows.end("s", again=True) is True  # asked to look again (a busy stack)
    assert windows.event("other") is True and windows.pending() == {"s", "other"}


def test_error_report_decision():
    applied = {"status": wire.APPLIED, "error_msg": ""}
    assert error_to_report(applied, "container web exited with code 1") == "container web exited with code 1"
    assert error_to_report(applied, "") is None  # nothing changed
    assert error_to_report({**applied, "error_msg": "x"}, "") == ""  # running again: cleared
    assert error_to_report({**applied, "error_msg": "x"}, "x") is None
    assert error_to_report(applied, "y", may_set=False) is None  # only events set one
    assert error_to_report({**applied, "error_msg": "x"}, "", may_set=False) == ""
    for status in (wire.APPLYING, wire.ERROR, wire.REMOVING):
        assert error_to_report({"status": status, "error_msg": ""}, "y") is None
    assert error_to_report(None, "y") is None


def test_a_death_the_list_does_not_show_yet_is_looked_at_again():
    died = {"c1"}
    assert list_behind([_raw("running", cid="c1"), _raw("running", cid="c2")], died) == {"c1"}
    assert list_behind([_raw("exited", "Exited (1) now", cid="c1")], died) == set()
    assert list_behind([], died) == set()


def test_decode_event():
    event = {
        "Type": "container",
        "Action": "health_status: unhealthy",
        "id": "abc",
        "Actor": {"ID": "abc", "Attributes": {"name": "p-web-1", wire.LABEL_STACK: "s1"}},
    }
    assert decode_event(event) == ("health_status", "abc", {"name": "p-web-1", wire.LABEL_STACK: "s1"})
    assert decode_event({"status": "die", "id": "x"}) == ("die", "x", {})


# --- the watcher on a stand-in engine -----------------------------------------------


def _event(action: str, stack_id: str = "s1", env_id: str = "env") -> dict:
    return {
        "Type": "container",
        "Action": action,
        "id": "c1",
        "Actor": {"ID": "c1", "Attributes": {wire.LABEL_ENV: env_id, wire.LABEL_STACK: stack_id, "name": "p-web-1"}},
    }


async def test_a_burst_of_1000_events_gives_a_handful_of_pushes():
    engine = FakeEngine([_raw("running", "Up")])
    db = AgentDB(None)
    reporter = FakeReporter(db)
    db.stack_status("s1", "r1", "env", "p-s1", wire.APPLIED)
    dispatcher = FakeDispatcher()
    watch = ContainerWatch(
        engine, reporter, db, dispatcher, window=0.02, rental_limit_reached=lambda _rental: False, machines=OneMachine()
    )  # type: ignore[arg-type]
    watch._env_id = "env"  # as follow() would set it, without a stream
    for i in range(1000):
        watch._on_event(watch._generation, _event("die" if i % 2 else "start"))
        watch._on_event(watch._generation, _event("die", env_id="another-env"))  # not ours
        if i == 500:
            engine.raw = [_raw("exited", "Exited (137) now")]
        if i % 100 == 0:
            await asyncio.sleep(0.003)  # the burst lasts a while: a flush may run in the middle
    await until(lambda: not watch._windows.pending() and not watch._tasks, timeout=5)
    assert watch.events == 1000
    assert 1 <= engine.lists <= 5, engine.lists
    containers = [shaped for _stack_id, shaped in reporter.puts]
    assert 1 <= len(containers) <= 3 and containers[-1][0]["State"] == "exited (137, OOM-killed)"
    assert reporter.reports[-1] == ("s1", wire.APPLIED, "container web exited with code 137 (OOM-killed)")
    assert engine.inspects <= engine.lists  # an event about the container forgets what was read

    # A job under way: nothing pushed or reported until it is over.
    dispatcher.busy = {"s1"}
    try:
        engine.raw, before = [_raw("running", "Up")], len(reporter.reports)
        watch._on_event(watch._generation, _event("start"))
        await asyncio.sleep(0.2)
        assert len(reporter.reports) == before and watch._windows.pending() == {"s1"}
    finally:
        dispatcher.busy = set()
    await until(lambda: reporter.reports[-1] == ("s1", wire.APPLIED, ""), timeout=3)
    assert reporter.puts[-1][1][0]["State"] == "running"


async def test_exit_facts_are_read_once_per_exit():
    engine = FakeEngine([])
    states = ContainerStates(engine, rental_limit_reached=lambda _rental: False)
    exited = _raw("exited", "Exited (137) 1 second ago")
    assert await states.facts([exited, _raw("running")]) == {"c1": ExitFacts(137, True)}
    await states.facts([{**exited, "Status": "Exited (137) 5 seconds ago"}])
    assert engine.inspects == 1
    await states.facts([{**exited, "Status": "Exited (1) now"}])  # another exit: read again
    assert engine.inspects == 2
    states.forget("c1")
    await states.facts([exited])
    assert engine.inspects == 3


async def test_a_kill_at_the_rentals_memory_limit_says_so():
    """A container killed because its rental's cgroup, which
    all the rental's containers share, ran out of memory. Docker says
    OOMKilled either way; whether the rental's limit stopped a charge tells
    the two apart."""
    reached = {"r1": False}
    states = ContainerStates(FakeEngine([]), rental_limit_reached=lambda rental: reached[rental])
    raw = {**_raw("exited", "Exited (137) 1 second ago"), "Labels": {wire.LABEL_RENTAL: "r1"}}
    facts = await states.facts([raw])
    assert facts["c1"] == ExitFacts(137, True)  # at its own limit: the rental's containers together were under theirs
    assert stop_reason(raw, facts["c1"]) == "exited with code 137 (OOM-killed)"
    reached["r1"] = True
    states.forget("c1")
    facts = await states.facts([raw])
    assert facts["c1"].rental_limit
    assert "the rental's memory limit, shared by all its containers, was reached" in stop_reason(raw, facts["c1"])

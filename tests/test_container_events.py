"""Container state pushed on change: Docker's events, coalesced per stack, reach
the marketplace's container list within a second; a stopped container says why
(State and the APPLIED stack's errorMsg); stops the agent causes say nothing."""

from __future__ import annotations

import asyncio
import time

import docker.errors

from gpuhost_agent.protocol import wire
from gpuhost_agent.core.coalesce import Coalescer
from gpuhost_agent.core.container_states import ContainerStates
from gpuhost_agent.core.container_watch import ContainerWatch, decode_event, error_to_report, list_behind
from gpuhost_agent.core.containers import ExitFacts, exit_facts, seed_containers, shaped_state, stack_error
from gpuhost_agent.uplink.outbox import CONTAINERS
from gpuhost_agent.core.status_reporter import StackRef
from gpuhost_agent.storage.agent_db import AgentDB
from conftest import TEST_IMAGE, until

# Runs until signalled: SIGUSR1 makes it exit 3, SIGUSR2 makes it eat memory until the OOM killer comes.
ON_DEMAND = f"""
services:
  app:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "trap 'exit 3' USR1; trap 'eat=1' USR2; while [ -z \\"$$eat\\" ]; do sleep 0.05; done; x=a; while true; do x=$$x$$x; done"]
    mem_limit: 16m
    stop_grace_period: 1s
"""


def _raw(state: str, status: str = "", *, service: str = "web", cid: str = "c1") -> dict:
    return {"Id": cid, "Names": [f"/p-{service}-1"], "State": state, "Status": status, "Created": 1,
            "Labels": {"com.docker.compose.service": service}, "Ports": []}


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
    assert [c["State"] for c in seed_containers([_raw("exited", "Exited (9) now", cid="x")], {"x": ExitFacts(9, True)})] \
        == ["exited (9, OOM-killed)"]


def test_stack_error_names_stopped_services():
    assert stack_error([_raw("running"), _raw("paused", service="db"), _raw("created", service="c")]) == ""
    oom = _raw("exited", "Exited (137) now", cid="a")
    assert stack_error([oom], {"a": ExitFacts(137, True)}) == "container web exited with code 137 (OOM-killed)"
    assert stack_error([_raw("dead", service="db"), _raw("restarting", "Restarting (1) now", service="api")]) \
        == "container api is restarting: it exited with code 1; container db is dead"
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
    assert windows.end("s") is True     # ...and one more window follows
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
    event = {"Type": "container", "Action": "health_status: unhealthy", "id": "abc",
             "Actor": {"ID": "abc", "Attributes": {"name": "p-web-1", wire.LABEL_STACK: "s1"}}}
    assert decode_event(event) == ("health_status", "abc", {"name": "p-web-1", wire.LABEL_STACK: "s1"})
    assert decode_event({"status": "die", "id": "x"}) == ("die", "x", {})


# --- the watcher on a stand-in engine -----------------------------------------------

class _Engine:
    def __init__(self, raw: list[dict]):
        self.raw, self.lists, self.inspects = raw, 0, 0

    async def stack_containers(self, stack_id):
        self.lists += 1
        await asyncio.sleep(0.005)
        return [dict(r) for r in self.raw]

    async def container_state(self, container_id):
        self.inspects += 1
        return {"ExitCode": 137, "OOMKilled": True}


class _Dispatcher:
    busy: set = set()

    def busy_stacks(self):
        return self.busy

    def ending_rentals(self):
        return set()


class _Reporter:
    """Records what the watch reports, as StatusReporter would send it."""

    def __init__(self, db: AgentDB):
        self.db, self.reports, self.puts = db, [], []

    def status(self, stack: StackRef, status: str, error_msg: str = "", *, job_id: str) -> None:
        assert job_id.startswith("container-")
        self.reports.append((stack.stack_id, status, error_msg))
        self.db.stack_status(stack.stack_id, stack.rental_id, stack.env_id, stack.project, status, error_msg)

    def containers(self, stack_id: str, containers: list[dict]) -> None:
        self.puts.append((CONTAINERS, {"containers": containers}))


def _event(action: str, stack_id: str = "s1", env_id: str = "env") -> dict:
    return {"Type": "container", "Action": action, "id": "c1",
            "Actor": {"ID": "c1", "Attributes": {wire.LABEL_ENV: env_id, wire.LABEL_STACK: stack_id, "name": "p-web-1"}}}


async def test_a_burst_of_1000_events_gives_a_handful_of_pushes():
    engine = _Engine([_raw("running", "Up")])
    db = AgentDB(None)
    reporter = _Reporter(db)
    db.stack_status("s1", "r1", "env", "p-s1", wire.APPLIED)
    watch = ContainerWatch(engine, reporter, db, _Dispatcher(), window=0.02)  # type: ignore[arg-type]
    watch._env_id = "env"  # as follow() would set it, without a stream
    puts = reporter.puts
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
    containers = [body["containers"] for kind, body in puts if kind == CONTAINERS]
    assert 1 <= len(containers) <= 3 and containers[-1][0]["State"] == "exited (137, OOM-killed)"
    assert reporter.reports[-1] == ("s1", wire.APPLIED, "container web exited with code 137 (OOM-killed)")
    assert engine.inspects <= engine.lists  # an event about the container forgets what was read

    # A job under way: nothing pushed or reported until it is over.
    _Dispatcher.busy = {"s1"}
    try:
        engine.raw, before = [_raw("running", "Up")], len(reporter.reports)
        watch._on_event(watch._generation, _event("start"))
        await asyncio.sleep(0.2)
        assert len(reporter.reports) == before and watch._windows.pending() == {"s1"}
    finally:
        _Dispatcher.busy = set()
    await until(lambda: reporter.reports[-1] == ("s1", wire.APPLIED, ""), timeout=3)
    assert puts[-1][1]["containers"][0]["State"] == "running"


async def test_exit_facts_are_read_once_per_exit():
    engine = _Engine([])
    states = ContainerStates(engine)
    exited = _raw("exited", "Exited (137) 1 second ago")
    assert await states.facts([exited, _raw("running")]) == {"c1": ExitFacts(137, True)}
    await states.facts([{**exited, "Status": "Exited (137) 5 seconds ago"}])
    assert engine.inspects == 1
    await states.facts([{**exited, "Status": "Exited (1) now"}])  # another exit: read again
    assert engine.inspects == 2
    states.forget("c1")
    await states.facts([exited])
    assert engine.inspects == 3


# --- end to end, on the real engine -------------------------------------------------

def _record_reports(store, stack_id: str) -> tuple[list, list]:
    """Every container list and status report the marketplace takes for the stack."""
    lists, statuses = [], []
    apply_containers, apply_status = store.apply_containers, store.apply_status

    def containers(target, containers, observed_at):
        if target == stack_id:
            lists.append(containers)
        return apply_containers(target, containers, observed_at)

    def status(target, report):
        if target == stack_id:
            statuses.append(dict(report))
        return apply_status(target, report)

    store.apply_containers, store.apply_status = containers, status
    return lists, statuses


def _states(store, stack_id: str) -> list[str]:
    return [c["State"] for c in (store.containers.get(stack_id) or {}).get("containers", [])]


def _the_container(docker_client, stack_id: str):
    (container,) = docker_client.containers.list(all=True, filters={"label": f"{wire.LABEL_STACK}={stack_id}"})
    return container


async def test_a_killed_container_is_listed_within_a_second(local_market, docker_client):
    renter, parts, _local = local_market
    rental_id, stack_id, _job = await renter.deployed()
    await until(lambda: _states(renter.store, stack_id) == ["running"])
    container = _the_container(docker_client, stack_id)
    lists, statuses = _record_reports(renter.store, stack_id)

    started = time.monotonic()
    await asyncio.to_thread(container.kill)
    while not [c["State"] for c in await renter.containers(rental_id, stack_id)][0].startswith("exited"):
        assert time.monotonic() - started < 5, "the kill never reached the marketplace"
        await asyncio.sleep(0.01)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"{elapsed:.3f}s from the kill to the renter's list"
    assert [c["State"] for c in await renter.containers(rental_id, stack_id)] == ["exited (137)"]
    await until(lambda: renter.store.stacks[stack_id]["errorMsg"] == "container app exited with code 137")
    assert renter.store.stacks[stack_id]["status"] == wire.APPLIED
    assert parts.db.stacks()[stack_id]["error_msg"] == "container app exited with code 137"

    # The periodic resync has nothing to add: it shares what was pushed.
    await until(lambda: parts.outbox.pending() == 0)
    pushed = len(lists)
    await parts.agent.resync_containers()
    assert len(lists) == pushed and parts.outbox.pending() == 0

    await asyncio.to_thread(container.start)
    await until(lambda: _states(renter.store, stack_id) == ["running"], timeout=3)
    await until(lambda: renter.store.stacks[stack_id]["errorMsg"] == "", timeout=3)
    assert [s["status"] for s in statuses] == [wire.APPLIED, wire.APPLIED]
    assert [s["errorMsg"] for s in statuses] == ["container app exited with code 137", ""]
    assert parts.outbox.rejected == 0


async def test_an_exit_code_and_an_oom_kill_say_why(local_market, docker_client):
    renter, parts, _local = local_market
    rental_id, stack_id, _job = await renter.deployed(ON_DEMAND)
    container = _the_container(docker_client, stack_id)

    await asyncio.to_thread(container.kill, "SIGUSR1")
    await until(lambda: _states(renter.store, stack_id) == ["exited (3)"], timeout=5)
    await until(lambda: renter.store.stacks[stack_id]["errorMsg"] == "container app exited with code 3")
    stack = next(s for s in await renter.stacks(rental_id) if s["stackId"] == stack_id)
    assert (stack["status"], stack["errorMsg"]) == (wire.APPLIED, "container app exited with code 3")

    await asyncio.to_thread(container.start)
    await until(lambda: renter.store.stacks[stack_id]["errorMsg"] == "", timeout=5)
    await asyncio.to_thread(container.kill, "SIGUSR2")
    await until(lambda: _states(renter.store, stack_id) == ["exited (137, OOM-killed)"], timeout=5)
    await until(lambda: renter.store.stacks[stack_id]["errorMsg"]
                == "container app exited with code 137 (OOM-killed)")
    assert renter.store.stacks[stack_id]["status"] == wire.APPLIED


async def test_a_burst_of_events_is_coalesced(local_market, docker_client):
    renter, parts, _local = local_market
    rental_id, stack_id, _job = await renter.deployed()
    await until(lambda: _states(renter.store, stack_id) == ["running"])
    await until(lambda: parts.outbox.pending() == 0)
    container = _the_container(docker_client, stack_id)
    lists, _statuses = _record_reports(renter.store, stack_id)
    watch = parts.agent.container_watch
    events_before, flushes_before = watch.events, watch.flushes

    def burst(rounds: int = 30) -> None:
        """Signals the sleeper ignores (a `kill` event each, no change) and
        pauses (a change each). This dockerd now and then loses or delays a
        pause, so its refusals are let be and the end is made running."""
        for _ in range(rounds):
            for _ in range(10):
                container.kill("SIGUSR1")
            for call in (container.pause, container.unpause):
                try:
                    call()
                except docker.errors.APIError:
                    pass
        for _ in range(100):
            container.reload()
            if container.status == "running":
                return
            try:
                container.unpause()
            except docker.errors.APIError:
                time.sleep(0.05)
        raise AssertionError(f"the container stayed {container.status}")

    started = time.monotonic()
    await asyncio.to_thread(burst)
    lasted = time.monotonic() - started
    await until(lambda: _states(renter.store, stack_id) == ["running"] and parts.outbox.pending() == 0
                and not watch._windows.pending(), timeout=5)
    events, flushes = watch.events - events_before, watch.flushes - flushes_before
    assert events >= 300
    # At most one read of the stack per window (plus the time the read takes), however many events.
    assert flushes <= lasted / watch.window + 5, (flushes, lasted, events)
    assert 1 <= len(lists) <= events // 10, (len(lists), flushes, events)
    assert [c["State"] for c in await renter.containers(rental_id, stack_id)] == ["running"]
    assert renter.store.stacks[stack_id]["errorMsg"] == ""  # paused is not stopped


async def test_stops_the_agent_causes_set_no_error(local_market, docker_client):
    renter, parts, _local = local_market
    (rental_a, stack_a, _), (rental_b, stack_b, _) = await asyncio.gather(renter.deployed(), renter.deployed())
    statuses = {stack_id: _record_reports(renter.store, stack_id)[1] for stack_id in (stack_a, stack_b)}

    status, _body = await renter.call("DELETE", f"/rentals/{rental_a}/stacks/{stack_a}")
    assert status == 200
    status, _body = await renter.call("DELETE", f"/rentals/{rental_b}")  # the rental's end takes its stack
    assert status == 200
    for rental_id, stack_id in ((rental_a, stack_a), (rental_b, stack_b)):
        await renter.wait_stack(rental_id, stack_id, (), timeout=30)
    await asyncio.sleep(1.0)  # a deferred look at the stacks would come now
    await until(lambda: parts.outbox.pending() == 0)
    for stack_id in (stack_a, stack_b):
        assert [s["status"] for s in statuses[stack_id]] == [wire.REMOVING, wire.REMOVED]
        assert not any(s.get("errorMsg") for s in statuses[stack_id])
        assert stack_id not in parts.db.stacks()
    assert parts.agent.container_watch.errors_reported == 0
    assert parts.outbox.rejected == 0  # no list sent for a stack the marketplace dropped

"""Container state pushed on change, on the real engine: Docker's events,
coalesced per stack, reach the marketplace's container list within a second; a
stopped container says why (State and the APPLIED stack's errorMsg); stops the
agent causes say nothing. (The decisions alone, on a stand-in engine:
tests/unit/test_container_events.py.)"""

from __future__ import annotations

import asyncio
import time

import docker.errors
from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import wire

# Runs until signalled: SIGUSR1 makes it exit 3, SIGUSR2 makes it eat memory until the OOM killer comes.
ON_DEMAND = f"""
services:
  app:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "trap 'exit 3' USR1; trap 'eat=1' USR2; while [ -z \\"$$eat\\" ]; do sleep 0.05; done; x=a; while true; do x=$$x$$x; done"]
    mem_limit: 16m
    stop_grace_period: 1s
"""


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
    container = await asyncio.to_thread(_the_container, docker_client, stack_id)
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
    container = await asyncio.to_thread(_the_container, docker_client, stack_id)

    await asyncio.to_thread(container.kill, "SIGUSR1")
    await until(lambda: _states(renter.store, stack_id) == ["exited (3)"], timeout=5)
    await until(lambda: renter.store.stacks[stack_id]["errorMsg"] == "container app exited with code 3")
    stack = next(s for s in await renter.stacks(rental_id) if s["stackId"] == stack_id)
    assert (stack["status"], stack["errorMsg"]) == (wire.APPLIED, "container app exited with code 3")

    await asyncio.to_thread(container.start)
    await until(lambda: renter.store.stacks[stack_id]["errorMsg"] == "", timeout=5)
    await asyncio.to_thread(container.kill, "SIGUSR2")
    await until(lambda: _states(renter.store, stack_id) == ["exited (137, OOM-killed)"], timeout=5)
    await until(lambda: renter.store.stacks[stack_id]["errorMsg"] == "container app exited with code 137 (OOM-killed)")
    assert renter.store.stacks[stack_id]["status"] == wire.APPLIED


async def test_a_burst_of_events_is_coalesced(local_market, docker_client):
    renter, parts, _local = local_market
    rental_id, stack_id, _job = await renter.deployed()
    await until(lambda: _states(renter.store, stack_id) == ["running"])
    await until(lambda: parts.outbox.pending() == 0)
    container = await asyncio.to_thread(_the_container, docker_client, stack_id)
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
    # Settled: the last window read and its list sent. An eventual condition, not a
    # timing bound (that is the flushes' below): beside the modern host's tests the
    # last report took more than 5 s once (CI at 01c2278).
    await until(
        lambda: (
            _states(renter.store, stack_id) == ["running"]
            and parts.outbox.pending() == 0
            and not watch._windows.pending()
        ),
        timeout=20,
    )
    events, flushes = watch.events - events_before, watch.flushes - flushes_before
    assert events >= 300
    # At most one read of the stack per window (plus the time the read takes), however many events.
    assert flushes <= lasted / watch.window + 5, (flushes, lasted, events)
    # Far fewer lists than events (one per event would be hundreds). Under
    # load the burst lasts longer, so more windows fall within it: CI once
    # saw 37 lists for 364 events in 138 flushes beside the modern host's
    # tests, one over the tenth this said before.
    assert 1 <= len(lists) <= events // 5, (len(lists), flushes, events)
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


# Healthy only while /healthy exists; checked every second (the policy's floor), unhealthy after one failure.
HEALTH_ON_DEMAND = f"""
services:
  app:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
    healthcheck:
      test: ["CMD", "test", "-e", "/healthy"]
      interval: 1s
      timeout: 1s
      retries: 1
"""


async def test_an_unhealthy_container_says_so(local_market, docker_client):
    """Running but failing its healthcheck: the list's State and the APPLIED
    stack's errorMsg say so, and both clear when the check passes again."""
    renter, _parts, _local = local_market
    rental_id, stack_id, _job = await renter.deployed(HEALTH_ON_DEMAND)
    await until(lambda: _states(renter.store, stack_id) == ["running (unhealthy)"], timeout=5)
    unhealthy = "container app is running but unhealthy (its healthcheck fails)"
    await until(lambda: renter.store.stacks[stack_id]["errorMsg"] == unhealthy, timeout=5)
    stack = next(s for s in await renter.stacks(rental_id) if s["stackId"] == stack_id)
    assert stack["status"] == wire.APPLIED

    container = await asyncio.to_thread(_the_container, docker_client, stack_id)
    touched = await asyncio.to_thread(container.exec_run, ["touch", "/healthy"])
    assert touched.exit_code == 0, touched.output
    await until(lambda: _states(renter.store, stack_id) == ["running"], timeout=5)
    await until(lambda: renter.store.stacks[stack_id]["errorMsg"] == "", timeout=5)


async def test_the_engine_sends_the_agent_only_the_actions_it_follows(docker_client) -> None:
    """A renter's healthcheck every 10 ms makes exec_create, exec_start and exec_die
    events, each with its command and every label, dozens a second: the agent asks
    the engine for the actions it follows alone (wire.CONTAINER_EVENTS), so none
    of those reach its loop."""
    from gpuhost_agent.runtime.engine.client import DockerEngine

    env_id = f"events-{time.monotonic_ns()}"
    engine, seen = DockerEngine(), []
    end = engine.watch_container_events(env_id, seen.append, lambda: None)
    container = None
    try:
        await asyncio.sleep(0.5)  # the stream is open
        container = await asyncio.to_thread(
            docker_client.containers.run,
            TEST_IMAGE,
            ["sleep", "600"],
            detach=True,
            labels={wire.LABEL_MANAGED: "true", wire.LABEL_ENV: env_id},
            healthcheck={"test": ["CMD", "true"], "interval": 10_000_000},
        )
        await until(lambda: any(str(e.get("Action")).startswith("health_status") for e in seen), timeout=10)
        await asyncio.sleep(1.0)  # some hundred probes
        await asyncio.to_thread(container.kill)
        await until(lambda: any(e.get("Action") == "die" for e in seen), timeout=10)
        actions = {str(e.get("Action")).split(":")[0] for e in seen}
        assert actions <= set(wire.CONTAINER_EVENTS), actions
        assert {"create", "start", "health_status", "kill", "die"} <= actions, actions
    finally:
        end()
        if container is not None:
            await asyncio.to_thread(container.remove, force=True)
        await engine.close()

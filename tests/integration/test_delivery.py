"""At-least-once delivery: a job handed out twice deploys once."""

from __future__ import annotations

import asyncio

from support.engine import env_containers
from support.stacks import SLEEPER as CONTENT
from support.waiting import until

from gpuhost_agent.protocol import wire, wire_time


async def test_job_delivered_again_after_completion_deploys_once(local_market, docker_client):
    renter, parts, local = local_market
    rental_id, _stack_id, job = await renter.deployed()
    before = [c.id for c in await asyncio.to_thread(env_containers, docker_client, renter.store.envId)]
    assert len(before) == 1

    local.state.redeliver(job.jobId)
    await until(lambda: job.deliveries == 2 and job.state == "completed")
    assert parts.dispatcher.duplicates_ignored == 1
    assert [c.id for c in await asyncio.to_thread(env_containers, docker_client, renter.store.envId)] == before
    assert (await renter.stacks(rental_id))[0]["status"] == wire.APPLIED


async def test_job_delivered_twice_while_running_deploys_once(local_market, docker_client):
    renter, parts, local = local_market
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, CONTENT)
    job = next(j for j in renter.store.jobs.values() if j.stackId == stack_id)
    await until(lambda: job.deliveries == 1)
    local.state.redeliver(job.jobId)  # while the agent is still deploying (settle watch included)
    await until(lambda: job.deliveries == 2)
    await renter.wait_stack(rental_id, stack_id, (wire.APPLIED,))
    await until(lambda: job.state == "completed")
    assert parts.dispatcher.duplicates_ignored == 1
    assert len(await asyncio.to_thread(env_containers, docker_client, renter.store.envId)) == 1


async def test_redeploy_of_same_stack_after_agent_restart_keeps_containers(local_market, docker_client):
    """A job redone by a fresh agent (no memory of it) converges on the same containers."""
    renter, parts, local = local_market
    _rental_id, _stack_id, job = await renter.deployed()
    before = [c.id for c in await asyncio.to_thread(env_containers, docker_client, renter.store.envId)]
    parts.db._write("DELETE FROM jobs")  # what an agent that lost its state file forgets
    local.state.redeliver(job.jobId)
    await until(lambda: job.deliveries == 2 and job.state == "completed", timeout=15)
    assert parts.dispatcher.duplicates_ignored == 0
    assert [c.id for c in await asyncio.to_thread(env_containers, docker_client, renter.store.envId)] == before


async def test_malformed_job_is_refused_and_others_still_run(local_market, docker_client):
    renter, parts, _local = local_market
    parts.dispatcher.submit(
        {"jobId": "bogus-1", "type": "stack.explode", "stackId": "s-1", "rentalId": "r", "envId": renter.store.envId}
    )
    parts.dispatcher.submit("not even an object")
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, CONTENT)
    assert (await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR)))["status"] == wire.APPLIED


async def test_waiting_long_poll_is_woken_by_a_new_job(local_market):
    """Pickup is not on a timer: while idle the agent keeps one poll parked in the
    marketplace, and a new job is handed to that poll at once."""
    renter, _parts, local = local_market
    rental_id = await renter.rental()
    await until(
        lambda: local.state.polls_started >= 1, timeout=10
    )  # the first poll parked (a loaded machine starts late)
    await asyncio.sleep(0.2)
    parked = local.state.polls_started
    await asyncio.sleep(1.5)
    assert local.state.polls_started == parked, "the agent polled again while idle: a timer, not a long poll"
    stack_id = await renter.stack(rental_id, CONTENT)
    job = next(j for j in renter.store.jobs.values() if j.stackId == stack_id)
    await until(lambda: job.deliveries == 1, timeout=5)
    pickup = wire_time.parse_iso(job.firstDeliveredAt) - wire_time.parse_iso(renter.store.stacks[stack_id]["createdAt"])
    assert pickup.total_seconds() < 1.0, pickup


async def test_a_redelivered_deploy_that_fails_before_up_leaves_the_running_stack_and_says_so(
    local_market, docker_client
):
    """A deploy job delivered again after a crash that fails for any reason
    before Compose's `up` (here: the host lowered GPUHOST_STACKS_PER_RENTAL since) used to tear
    down the stack that job had started. Its containers keep running, and the report says so."""
    renter, parts, local = local_market
    rental_id = await renter.rental()
    stack_ids = [await renter.stack(rental_id, CONTENT) for _ in range(2)]
    for stack_id in stack_ids:
        await renter.wait_stack(rental_id, stack_id, (wire.APPLIED,))
    job = next(j for j in renter.store.jobs.values() if j.stackId == stack_ids[0])
    await until(lambda: job.state == "completed")

    def running() -> list[str]:
        listed = docker_client.containers.list(filters={"label": f"{wire.LABEL_STACK}={stack_ids[0]}"})
        return sorted(container.id for container in listed)

    before = await asyncio.to_thread(running)
    assert len(before) == 1
    parts.deployer.stacks_per_rental = 1
    parts.db._write("DELETE FROM jobs")  # as after a crash before the job was recorded finished
    local.state.redeliver(job.jobId)
    await until(lambda: job.deliveries == 2 and job.state == "completed", timeout=15)
    stack = await renter.wait_stack(rental_id, stack_ids[0], (wire.ERROR,))
    assert "already has 1 stacks" in stack["errorMsg"], stack
    assert "1 running container(s) from before this deploy were left running" in stack["errorMsg"], stack
    assert await asyncio.to_thread(running) == before

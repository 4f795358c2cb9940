"""The marketplace stopped for a while during deploys and container changes.

While it is away the agent carries on with what it had already received (a
deploy, a removal), sees a renter's container stop, and keeps everything it
owes the marketplace in its outbox. Once the marketplace is back (same port,
same store) it holds every final status and the latest container lists,
nothing duplicated and nothing refused.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from support.agent_process import Market, start_in_process
from support.engine import env_containers, remove_env_resources
from support.renter import Renter
from support.stacks import SLEEPER
from support.waiting import until

from gpuhost_agent.core.stacks.container_list import seed_containers
from gpuhost_agent.protocol import wire
from gpuhost_agent.service.daemon import stop_agent
from gpuhost_agent.uplink.outbox import CONTAINERS


@pytest.fixture
async def world(tmp_path, docker_client):
    market = Market(tmp_path / "market.json")
    await market.start()
    parts, task = await start_in_process(market, tmp_path / "state", reconcile_grace_seconds=4)
    http = aiohttp.ClientSession()
    try:
        yield Renter(http, market.base_url, market.store), market, parts
    finally:
        await http.close()
        await stop_agent(parts, task)
        await market.stop()
        await asyncio.to_thread(remove_env_resources, docker_client, market.store.envId)


def _job(market: Market, stack_id: str, job_type: str):
    return next(job for job in market.store.jobs.values() if job.stackId == stack_id and job.type == job_type)


def _statuses(market: Market, stack_id: str) -> list[str]:
    return [status for status, _at in market.store.stacks[stack_id]["history"]]


def _docker_view(docker_client, stack_id: str) -> list[dict]:
    """What Docker shows for the stack, in the shape the marketplace keeps."""
    return seed_containers(
        docker_client.api.containers(all=True, filters={"label": [f"{wire.LABEL_STACK}={stack_id}"]})
    )


def _pending_list(parts, stack_id: str) -> list[dict] | None:
    """The container list of the stack waiting in the outbox (on disk), if any."""
    return next(
        (
            body["containers"]
            for kind, target, _seq, body in parts.db.outbox_entries()
            if kind == CONTAINERS and target == stack_id
        ),
        None,
    )


async def test_outage_during_deploy_removal_and_container_change(world, docker_client):
    renter, market, parts = world
    await asyncio.wait_for(parts.session.connected.wait(), 10)
    (_rental_a, stack_a, _), (rental_c, stack_c, _) = await asyncio.gather(renter.deployed(), renter.deployed())
    [container_a] = [
        c
        for c in await asyncio.to_thread(env_containers, docker_client, market.store.envId)
        if c.labels[wire.LABEL_STACK] == stack_a
    ]

    # B's deploy and C's removal are delivered; then the marketplace goes away.
    rental_b = await renter.rental()
    stack_b = await renter.stack(rental_b, SLEEPER)
    status, body = await renter.call("DELETE", f"/rentals/{rental_c}/stacks/{stack_c}")
    assert status == 200, body
    deploy_b, remove_c = _job(market, stack_b, wire.JOB_DEPLOY), _job(market, stack_c, wire.JOB_REMOVE)
    # (Once C's REMOVING was heard: a removal none of whose reports got through
    # is the next test's case.)
    await until(
        lambda: (
            deploy_b.deliveries == 1
            and remove_c.deliveries == 1
            and _statuses(market, stack_c).count(wire.REMOVING) == 2
        ),
        timeout=10,
    )
    await market.stop()

    # Meanwhile: a renter's container stops (a container change), and both jobs run to the end.
    await asyncio.to_thread(container_a.stop, timeout=1)
    await until(lambda: (_pending_list(parts, stack_a) or [{}])[0].get("State", "").startswith("exited ("), timeout=15)
    await until(
        lambda: (
            (parts.db.stacks().get(stack_b) or {}).get("status") == wire.APPLIED
            and stack_c not in parts.db.stacks()
            and parts.db.completion(deploy_b.jobId) is not None
            and parts.db.completion(remove_c.jobId) is not None
        ),
        timeout=20,
    )
    assert [
        c.labels[wire.LABEL_STACK]
        for c in await asyncio.to_thread(env_containers, docker_client, market.store.envId)
        if c.labels[wire.LABEL_STACK] != stack_a
    ] == [stack_b]
    assert parts.outbox.pending() > 0
    # The marketplace heard none of it.
    assert market.store.stacks[stack_b]["status"] == wire.APPLYING
    assert stack_c in market.store.stacks
    assert deploy_b.state != "completed" and remove_c.state != "completed"
    assert market.store.containers[stack_a]["containers"][0]["State"] == "running"

    await market.start()  # same port, same store
    await until(
        lambda: (
            market.store.stacks[stack_b]["status"] == wire.APPLIED
            and stack_c not in market.store.stacks
            and deploy_b.state == "completed"
            and remove_c.state == "completed"
            and parts.outbox.pending() == 0
        ),
        timeout=30,
    )

    history_b = _statuses(market, stack_b)
    assert history_b.count(wire.APPLIED) == 1 and history_b[-1] == wire.APPLIED, history_b
    history_a = _statuses(market, stack_a)
    # A stopped container does not change the status: APPLIED again, its errorMsg naming the container.
    assert history_a.count(wire.APPLIED) == 2 and history_a[-1] == wire.APPLIED, history_a
    assert market.store.stacks[stack_a]["errorMsg"].startswith("container app exited with code ")
    assert (deploy_b.outcome, remove_c.outcome) == (wire.OUTCOME_SUCCEEDED, wire.OUTCOME_SUCCEEDED), (
        deploy_b.errorMsg,
        remove_c.errorMsg,
    )
    assert [job.deliveries for job in (deploy_b, remove_c)] == [1, 1]

    # The latest container lists, equal to what Docker shows; the removed stack has none.
    await asyncio.to_thread(container_a.reload)
    assert container_a.status == "exited"  # nobody restarted the renter's stopped container
    listed_a = market.store.containers[stack_a]["containers"]
    assert [(c["Id"], c["State"]) for c in listed_a] == [
        (container_a.id, f"exited ({container_a.attrs['State']['ExitCode']})")
    ]
    assert listed_a == await asyncio.to_thread(_docker_view, docker_client, stack_a)
    listed_b = market.store.containers[stack_b]["containers"]
    assert [c["State"] for c in listed_b] == ["running"]
    assert listed_b == await asyncio.to_thread(_docker_view, docker_client, stack_b)
    assert (
        stack_c not in market.store.containers and await asyncio.to_thread(_docker_view, docker_client, stack_c) == []
    )

    # Exactly one set of containers, nothing refused.
    assert sorted(
        c.labels[wire.LABEL_STACK] for c in await asyncio.to_thread(env_containers, docker_client, market.store.envId)
    ) == sorted([stack_a, stack_b])
    assert parts.outbox.pending() == 0
    assert parts.outbox.rejected == 0
    assert parts.outbox.dropped == 0


class ReportsRejected(AssertionError):
    """The failure this test guards against, named apart from the other assertions."""


async def test_outage_while_a_stack_is_deployed_and_removed_at_once(world, docker_client):
    """The renter creates a stack and deletes it right away; both jobs are
    delivered, then the marketplace goes away. The removal stops the deploy
    where it can (core/stacks/deploy_cancels.py) or waits for it, one job at a
    time per stack, so every report of the stack, the removal's included, is
    still in the outbox when the marketplace comes back."""
    renter, market, parts = world
    await asyncio.wait_for(parts.session.connected.wait(), 10)
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, SLEEPER)
    status, body = await renter.call("DELETE", f"/rentals/{rental_id}/stacks/{stack_id}")
    assert status == 200, body
    deploy, remove = _job(market, stack_id, wire.JOB_DEPLOY), _job(market, stack_id, wire.JOB_REMOVE)
    await until(lambda: deploy.deliveries == 1 and remove.deliveries == 1, timeout=10)
    await market.stop()

    await until(
        lambda: parts.db.completion(deploy.jobId) is not None and parts.db.completion(remove.jobId) is not None,
        timeout=20,
    )
    assert await asyncio.to_thread(env_containers, docker_client, market.store.envId) == []
    assert parts.outbox.pending() > 0
    assert stack_id in market.store.stacks and remove.state != "completed"

    await market.start()
    await until(
        lambda: (
            stack_id not in market.store.stacks
            and deploy.state == "completed"
            and remove.state == "completed"
            and parts.outbox.pending() == 0
        ),
        timeout=30,
    )
    assert remove.outcome == wire.OUTCOME_SUCCEEDED, remove.errorMsg
    assert (deploy.outcome, deploy.errorMsg) in {  # stopped before its `up`, or finished before the removal
        (wire.OUTCOME_FAILED, "deploy stopped: the stack's removal came before the deploy finished"),
        (wire.OUTCOME_SUCCEEDED, None),
    }, deploy.errorMsg
    assert stack_id not in market.store.containers
    assert await asyncio.to_thread(env_containers, docker_client, market.store.envId) == []
    if parts.outbox.rejected:
        raise ReportsRejected(f"{parts.outbox.rejected} report(s) refused by the marketplace after its return")

"""kill -9 of the agent at each step of a deploy and of a removal.

After a restart on the same state directory the stack must be APPLIED (or
gone) with exactly one set of containers, and the marketplace must hold the
final status, the matching container list and the job's completion.
"""

from __future__ import annotations

import asyncio

import pytest
from support.agent_process import Market, process_world
from support.engine import env_containers
from support.renter import Renter
from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import wire

# Two services: a crash "while Compose runs" can leave one created and not the other.
STACK = (
    f"services:\n"
    f"  app:\n    image: {TEST_IMAGE}\n    command: ['sleep', '3600']\n    stop_grace_period: 1s\n"
    f"  side:\n    image: {TEST_IMAGE}\n    command: ['sleep', '3600']\n    stop_grace_period: 1s\n"
)


@pytest.fixture
async def world(tmp_path, docker_client):
    async with process_world(tmp_path, docker_client) as made:
        yield made


def _container_names(docker_client, env_id: str) -> list[str]:
    return sorted(c.name for c in env_containers(docker_client, env_id))


async def _assert_applied_once(renter: Renter, market: Market, docker_client, rental_id: str, stack_id: str) -> None:
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    jobs = [job for job in market.store.jobs.values() if job.stackId == stack_id]
    await until(lambda: all(job.state == "completed" for job in jobs), timeout=30)
    assert [job.outcome for job in jobs] == [wire.OUTCOME_SUCCEEDED]
    containers = await asyncio.to_thread(env_containers, docker_client, market.store.envId)
    services = sorted(c.labels["com.docker.compose.service"] for c in containers)
    assert services == ["app", "side"], f"not exactly one set of containers: {services}"
    assert all(c.status == "running" for c in containers)

    async def listed_as_docker_has_them() -> bool:
        return sorted(
            c["Name"] for c in market.store.containers.get(stack_id, {}).get("containers", [])
        ) == await asyncio.to_thread(_container_names, docker_client, market.store.envId)

    await until(listed_as_docker_has_them, timeout=15)


@pytest.mark.parametrize("point", ["deploy.before_compose_up", "compose.up.running", "deploy.before_applied_report"])
async def test_kill_during_deploy_then_restart_converges(world, docker_client, point):
    renter, market, agent = world
    await agent.start(crash_at=point)
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, STACK)
    assert await agent.wait_exit() == -9, (await asyncio.to_thread(agent.logs))[-3000:]
    assert f"crash point {point} reached" in await asyncio.to_thread(agent.logs)
    assert market.store.stacks[stack_id]["status"] == wire.APPLYING  # the marketplace never heard the end

    await agent.start()
    await _assert_applied_once(renter, market, docker_client, rental_id, stack_id)
    history = [status for status, _at in market.store.stacks[stack_id]["history"]]
    assert history.count(wire.APPLIED) == 1, history


@pytest.mark.parametrize(
    "point", ["remove.before_compose_down", "compose.down.running", "remove.before_removed_report"]
)
async def test_kill_during_removal_then_restart_converges(world, docker_client, point):
    renter, market, agent = world
    await agent.start(crash_at=point)
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, STACK)
    await _assert_applied_once(renter, market, docker_client, rental_id, stack_id)

    status, _ = await renter.call("DELETE", f"/rentals/{rental_id}/stacks/{stack_id}")
    assert status in (200, 202, 204)
    assert await agent.wait_exit() == -9, (await asyncio.to_thread(agent.logs))[-3000:]
    assert stack_id in market.store.stacks  # REMOVED never reached the marketplace

    await agent.start()
    await renter.wait_stack(rental_id, stack_id, (), timeout=60)  # gone from the renter's list
    assert await asyncio.to_thread(env_containers, docker_client, market.store.envId) == []
    await until(lambda: all(job.state == "completed" for job in market.store.jobs.values()), timeout=30)
    assert {job.outcome for job in market.store.jobs.values()} == {wire.OUTCOME_SUCCEEDED}


async def test_sigterm_mid_deploy_stops_in_bounded_time_and_the_next_start_converges(world, docker_client):
    """SIGTERM while a deploy is still watching its containers settle: the job
    is abandoned after the configured grace, the process exits 0 in bounded
    time, the containers keep running, and the next start finishes the job."""
    renter, market, agent = world
    await asyncio.to_thread(
        lambda: agent.config.write_text(
            agent.config.read_text() + "GPUHOST_SETTLE_SECONDS=60\nGPUHOST_SHUTDOWN_GRACE_SECONDS=1\n"
        )
    )
    await agent.start()
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, STACK)
    await until(
        lambda: asyncio.to_thread(
            lambda: (
                len(env_containers(docker_client, market.store.envId)) == 2
                and all(c.status == "running" for c in env_containers(docker_client, market.store.envId))
            )
        ),
        timeout=30,
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await agent.stop() == 0
    assert loop.time() - started < 12  # grace 1 s + 5 s unwinding + 3 s flush, at most
    assert "job_abandoned" in await asyncio.to_thread(agent.logs)
    assert all(
        c.status == "running" for c in await asyncio.to_thread(env_containers, docker_client, market.store.envId)
    )

    await asyncio.to_thread(
        lambda: agent.config.write_text(agent.config.read_text().replace("GPUHOST_SETTLE_SECONDS=60\n", ""))
    )
    await agent.start()
    await _assert_applied_once(renter, market, docker_client, rental_id, stack_id)

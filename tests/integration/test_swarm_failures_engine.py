"""Failures in a Swarm environment, end to end through the local marketplace
and a leader agent process on the two-node test cluster.

A machine that goes away (its dockerd stopped, its containers with it): the
stack with a container there says so in errorMsg, naming the machine and the
container; its GPUs leave `availableGPUs`; Swarm does not move the pinned
task elsewhere. When the machine is back, the task runs there again and the
message is cleared.

The leader killed with SIGKILL and its database lost: restarted, it takes
the GPU assignments back from the services' labels and leaves the running
stack's containers as they are.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from support.swarm import GPU_STACK, cluster, docker, labelled, train_of
from support.waiting import until

from gpuhost_agent.local_marketplace import shapes
from gpuhost_agent.protocol import wire

pytestmark = pytest.mark.swarm
NODE_LABEL = "com.docker.swarm.node.id"


async def stack_of(renter, rental_id: str, stack_id: str) -> dict:
    return next(s for s in await renter.stacks(rental_id) if s["stackId"] == stack_id)


async def test_a_machine_that_goes_away_is_said_its_gpus_leave_and_its_task_comes_back_there(swarm_leader) -> None:
    (renter, market, agent), machines = swarm_leader
    node_of = {machine: node for node, machine in machines.items()}
    await agent.start()
    await until(lambda: shapes.listing(market.store)["totalGPUs"] == 4, timeout=90)
    # Two GPUs for one rental, one for the other: one machine's GPUs each, one GPU left free.
    rentals = [await renter.rental(gpu_count=2), await renter.rental(gpu_count=1)]
    stacks = {rental_id: await renter.stack(rental_id, GPU_STACK) for rental_id in rentals}
    where = {}
    for rental_id, stack_id in stacks.items():
        done = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=120)
        assert done and done["status"] == wire.APPLIED, (done, agent.logs()[-3000:])
        await until(lambda r=rental_id, s=stack_id: train_of(renter, r, s), timeout=30)
        train = await train_of(renter, rental_id, stack_id)
        assert train is not None
        where[rental_id] = machines[labelled(train)[NODE_LABEL]]
    assert sorted(where.values()) == [1, 2]
    away = next(rental_id for rental_id, machine in where.items() if machine == 2)
    stays = next(rental_id for rental_id in rentals if rental_id != away)
    before = await train_of(renter, away, stacks[away])
    assert before is not None
    service = f"{labelled(before)['com.docker.stack.namespace']}_train"
    # The free GPU is on the one-GPU rental's machine: it leaves with machine 2 if that is where it is.
    free_while_away = 0 if where[rentals[1]] == 2 else 1
    await until(lambda: shapes.listing(market.store)["availableGPUs"] == 1, timeout=30)

    await asyncio.to_thread(cluster, "stop", "2")
    try:

        async def said() -> bool:
            return "is down" in (await stack_of(renter, away, stacks[away]))["errorMsg"]

        await until(said, timeout=60)
        stack = await stack_of(renter, away, stacks[away])
        assert stack["status"] == wire.APPLIED, stack
        assert f"(Swarm node {node_of[2][:12]}) is down: container train cannot run" in stack["errorMsg"], stack
        await until(lambda: shapes.listing(market.store)["availableGPUs"] == free_while_away, timeout=30)
        assert (await stack_of(renter, stays, stacks[stays]))["errorMsg"] == ""

        # Pinned: no task of the service on machine 1 (Swarm's restart policy here is `none`, from
        # Compose's default `restart: "no"`: the task is shown as Swarm last knew it).
        task_ids = (await asyncio.to_thread(docker, 1, "service", "ps", "-q", "--no-trunc", service)).split()
        nodes = await asyncio.to_thread(docker, 1, "inspect", "--format", "{{.NodeID}}", *task_ids)
        assert set(nodes.split()) == {node_of[2]}, nodes
    finally:
        await asyncio.to_thread(cluster, "start", "2")

    async def cleared() -> bool:
        return (await stack_of(renter, away, stacks[away]))["errorMsg"] == ""

    await until(cleared, timeout=90)
    await until(lambda: shapes.listing(market.store)["availableGPUs"] == 1, timeout=30)

    async def running_again() -> bool:
        train = await train_of(renter, away, stacks[away])
        return train is not None and train["State"] == "running" and train["Id"] != before["Id"]

    await until(running_again, timeout=60)  # a new container: the leader forced a new task (policy `none`)
    train = await train_of(renter, away, stacks[away])
    assert train is not None and machines[labelled(train)[NODE_LABEL]] == 2
    assert "swarm_service_restarted" in await asyncio.to_thread(agent.logs)


async def gpus_of(machine: int, container_id: str) -> set[str]:
    (info,) = json.loads(await asyncio.to_thread(docker, machine, "inspect", container_id))
    visible = next(e for e in info["Config"]["Env"] if e.startswith("NVIDIA_VISIBLE_DEVICES="))
    return set(visible.split("=", 1)[1].split(","))


async def test_the_leader_killed_and_its_state_lost_takes_its_ledger_back_and_moves_no_running_task(
    swarm_leader,
) -> None:
    """SIGKILL, and the agent's database gone with it: the restarted leader
    takes the GPU assignments back from the services' labels, so the next
    rental gets the other GPUs, and the running stack keeps its containers."""
    (renter, market, agent), machines = swarm_leader
    await agent.start()
    await until(lambda: shapes.listing(market.store)["totalGPUs"] == 4, timeout=90)
    first = await renter.rental(gpu_count=2)
    first_stack = await renter.stack(first, GPU_STACK)
    done = await renter.wait_stack(first, first_stack, (wire.APPLIED, wire.ERROR), timeout=120)
    assert done and done["status"] == wire.APPLIED, done
    await until(lambda: train_of(renter, first, first_stack), timeout=30)
    before = await train_of(renter, first, first_stack)
    assert before is not None
    machine = machines[labelled(before)[NODE_LABEL]]

    agent.process.kill()
    await agent.process.wait()
    for name in ("agent.db", "agent.db-wal", "agent.db-shm"):
        await asyncio.to_thread((agent.state_dir / name).unlink, missing_ok=True)
    await agent.start()

    second = await renter.rental(gpu_count=2)
    second_stack = await renter.stack(second, GPU_STACK)
    done = await renter.wait_stack(second, second_stack, (wire.APPLIED, wire.ERROR), timeout=120)
    assert done and done["status"] == wire.APPLIED, (done, (await asyncio.to_thread(agent.logs))[-3000:])
    await until(lambda: train_of(renter, second, second_stack), timeout=30)
    other = await train_of(renter, second, second_stack)
    assert other is not None
    other_machine = machines[labelled(other)[NODE_LABEL]]
    assert other_machine != machine  # the first rental's machine is full: its GPUs were taken back
    assert not (await gpus_of(machine, before["Id"])) & (await gpus_of(other_machine, other["Id"]))
    after = await train_of(renter, first, first_stack)
    assert after is not None and after["Id"] == before["Id"] and after["State"] == "running"  # not moved, not restarted
    assert shapes.listing(market.store)["availableGPUs"] == 0

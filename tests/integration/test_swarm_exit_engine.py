"""A container on machine 2 that stops by itself says why, in the words one
machine uses: on the two-node cluster, the leader agent process, machine 2's
worker agent and the local marketplace. Swarm's task says only the exit
code; whether the kernel's OOM killer did it is in the container's inspect,
on machine 2's engine, which the leader asks through machine 2's agent."""

from __future__ import annotations

import asyncio

import pytest
from support.stacks import TEST_IMAGE
from support.swarm import docker, leader_ready
from support.waiting import until

from gpuhost_agent.protocol import wire

pytestmark = pytest.mark.swarm


def hog_stack(gpu: str) -> str:
    """A service on the rental's GPU given that holds 64 MB in a shell variable under a 16 MiB limit."""
    device = "{driver: nvidia, device_ids: ['" + gpu + "'], capabilities: [gpu]}"
    return f"""
services:
  hog:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "sleep 2; x=$$(head -c 64000000 /dev/zero | tr '\\\\0' a); sleep 3600"]
    mem_limit: 16m
    deploy: {{resources: {{reservations: {{devices: [{device}]}}}}}}
"""


async def test_an_oom_kill_on_machine_two_is_said_as_on_one_machine(swarm_leader, swarm_worker) -> None:
    (renter, market, agent), machines = swarm_leader
    await leader_ready(agent, market)
    rental_id = await renter.rental(gpu_count=4)
    # A rental's GPUs are numbered machine by machine, the machines in the order of their node ids.
    stack_id = await renter.stack(rental_id, hog_stack("0" if machines[min(machines)] == 2 else "2"))
    applied = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=120)
    assert applied and applied["status"] == wire.APPLIED, (applied, agent.logs()[-3000:])

    async def said() -> str:
        (stack,) = [s for s in await renter.stacks(rental_id) if s["stackId"] == stack_id]
        return stack["errorMsg"]

    async def exited() -> bool:
        return "exited" in await said()

    await until(exited, timeout=60)
    message = await said()
    assert message == "container hog exited with code 137 (OOM-killed)", message
    on_two = await asyncio.to_thread(docker, 2, "ps", "-a", "--format", "{{.Names}}")
    assert "_hog." in on_two, on_two  # it ran on machine 2
    (shaped,) = await renter.containers(rental_id, stack_id)
    assert "OOM" in str(shaped), shaped
    # The leader follows machine 2's container events through its agent (core/swarm/worker_events.py).
    node_two = next(node for node, machine in machines.items() if machine == 2)
    logs = await asyncio.to_thread(agent.logs)
    assert any("worker_events_following" in line and node_two in line for line in logs.splitlines())
    assert "worker_events_unavailable" not in logs

"""A rental's share of each machine's disk, on the two-node cluster: the
leader agent process (a share of 64 MiB per machine, measured every second),
machine 2's worker agent, the local marketplace, a renter over HTTP. A
service on machine 2 writes 100 MiB into its container; the leader sees it
only through machine 2's agent (its own engine knows nothing of machine 2's
containers). The stack is reported ERROR saying which disk, its services
are scaled to no task (a container merely stopped would be started again by
Swarm), and it stays stopped: no new task, no redeploy."""

from __future__ import annotations

import asyncio
import json

import pytest
from support.stacks import TEST_IMAGE
from support.swarm import docker, leader_ready
from support.waiting import until

from gpuhost_agent.protocol import wire

pytestmark = pytest.mark.swarm


def writer_stack(quiet_gpu: str, writer_gpu: str) -> str:
    """A quiet service, and one that writes 100 MiB into its container, each on the rental's GPU given."""
    device = (
        "{{resources: {{reservations: {{devices: [{{driver: nvidia, device_ids: ['{}'], capabilities: [gpu]}}]}}}}}}"
    )
    return f"""
services:
  quiet:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "trap exit TERM; sleep 3600 & wait"]
    deploy: {device.format(quiet_gpu)}
  writer:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "dd if=/dev/zero of=/big bs=1M count=100 && trap exit TERM; sleep 3600 & wait"]
    deploy: {device.format(writer_gpu)}
"""


def running_anywhere(stack_id: str) -> list[str]:
    """The stack's running containers on either machine's engine."""
    return [
        found
        for node in (1, 2)
        for found in docker(node, "ps", "-q", "--filter", f"label={wire.LABEL_STACK}={stack_id}").split()
    ]


def replicas(stack_id: str) -> dict[str, str]:
    listed = docker(1, "service", "ls", "--format", "json", "--filter", f"label={wire.LABEL_STACK}={stack_id}")
    return {line["Name"]: line["Replicas"] for line in map(json.loads, listed.splitlines())}


async def test_a_rental_over_its_share_of_machine_twos_disk_is_stopped_there_and_stays_stopped(
    swarm_leader, swarm_worker
) -> None:
    (renter, market, agent), machines = swarm_leader
    await asyncio.to_thread(agent.configure, GPUHOST_RENTAL_DISK="64m", GPUHOST_DISK_WATCH_SECONDS="1")
    await leader_ready(agent, market)
    rental_id = await renter.rental(gpu_count=4)
    # A rental's GPUs are numbered machine by machine, the machines in the order of their node ids.
    writer_gpu, quiet_gpu = ("0", "2") if machines[min(machines)] == 2 else ("2", "0")
    stack_id = await renter.stack(rental_id, writer_stack(quiet_gpu, writer_gpu))
    applied = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=120)
    assert applied and applied["status"] == wire.APPLIED, (applied, agent.logs()[-3000:])
    on_two = await asyncio.to_thread(docker, 2, "ps", "--format", "{{.Names}}")
    assert "_writer." in on_two and "_quiet." not in on_two, on_two  # the writer is on machine 2 alone
    message = (await renter.wait_stack(rental_id, stack_id, (wire.ERROR,), timeout=90))["errorMsg"]
    assert "above its share of 0.06 GiB" in message and "'s disk" in message, message
    assert "the host's disk" not in message  # named by its machine
    await until(lambda: asyncio.to_thread(lambda: not running_anywhere(stack_id)), timeout=60)
    scaled = lambda: asyncio.to_thread(lambda: set(replicas(stack_id).values()) == {"0/0"})  # noqa: E731
    await until(scaled, timeout=30)  # both services: no task wanted, none left
    await asyncio.sleep(5)  # several watch rounds, reconciles and container polls later: still stopped, still ERROR
    assert await asyncio.to_thread(running_anywhere, stack_id) == [] and await scaled()
    (stack,) = [s for s in await renter.stacks(rental_id) if s["stackId"] == stack_id]
    assert stack["status"] == wire.ERROR and stack["errorMsg"] == message

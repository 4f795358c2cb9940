"""A rental bigger than one machine, end to end: the leader agent process on
the two-node cluster, the local marketplace, a renter over HTTP. A 4-GPU
rental gets both machines' GPUs (2 each, numbered 0-1 on one machine and 2-3
on the other); a stack of one GPU service per machine, as distributed
training is written (`device_ids`), runs each service on the machine of its
GPUs with exactly those, and the two talk over the stack's
overlay. One service asking for all four GPUs is refused, saying to split
it, and the rental's other stacks are untouched."""

from __future__ import annotations

import asyncio
import json

import pytest
from support.stacks import TEST_IMAGE
from support.swarm import cluster_gpus, docker, labelled, leader_ready
from support.waiting import until

from gpuhost_agent.local_marketplace import shapes
from gpuhost_agent.protocol import wire

pytestmark = pytest.mark.swarm


def gpus(*numbers: int) -> str:
    """The rental's GPUs by the renter's numbers, which run machine by machine."""
    ids = ", ".join(f'"{n}"' for n in numbers)
    device = f"{{driver: nvidia, device_ids: [{ids}], capabilities: [gpu]}}"
    return f"deploy: {{resources: {{reservations: {{devices: [{device}]}}}}}}"


TWO_RANKS = f"""
services:
  rank0:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir /www && echo from-rank0 > /www/i && exec httpd -f -p 8080 -h /www"]
    expose: ["8080"]
    {gpus(0, 1)}
  rank1:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "trap exit TERM; sleep 3600 & wait"]
    {gpus(2, 3)}
"""
ONE_SERVICE_ALL_GPUS = f"""
services:
  train:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
    deploy: {{resources: {{reservations: {{devices: [{{driver: nvidia, count: all, capabilities: [gpu]}}]}}}}}}
"""


async def test_a_rental_of_two_machines_runs_one_service_on_each_and_they_talk(swarm_leader) -> None:
    (renter, market, agent), machines = swarm_leader
    await leader_ready(agent, market)
    rental_id = await renter.rental(gpu_count=4)
    stack_id = await renter.stack(rental_id, TWO_RANKS)
    done = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=120)
    assert done and done["status"] == wire.APPLIED, (done, agent.logs()[-3000:])
    assert shapes.listing(market.store)["availableGPUs"] == 0

    async def both_running() -> bool:
        listed = await renter.containers(rental_id, stack_id)
        return len(listed) == 2 and all(c["State"] == "running" for c in listed)

    await until(both_running, timeout=60)
    placed = {}
    for container in await renter.containers(rental_id, stack_id):
        labels = labelled(container)
        machine = machines[labels["com.docker.swarm.node.id"]]
        (info,) = json.loads(await asyncio.to_thread(docker, machine, "inspect", container["Id"]))
        visible = next(e for e in info["Config"]["Env"] if e.startswith("NVIDIA_VISIBLE_DEVICES="))
        assert set(visible.split("=", 1)[1].split(",")) == cluster_gpus(machine), labels  # that machine's GPUs
        placed[labels["com.docker.compose.service"]] = (machine, info)
    assert sorted(machine for machine, _ in placed.values()) == [1, 2]

    (_, rank0), (rank1_machine, rank1) = placed["rank0"], placed["rank1"]
    address = next(n["IPAddress"] for n in rank0["NetworkSettings"]["Networks"].values() if n.get("IPAddress"))
    ask = f'printf "GET /i HTTP/1.0\\r\\n\\r\\n" | nc -w 2 {address} 8080'

    async def answered() -> bool:
        out = await asyncio.to_thread(docker, rank1_machine, "exec", rank1["Id"], "sh", "-c", ask, check=False)
        return "from-rank0" in out

    await until(answered, timeout=30)  # rank1, on the other machine, over the stack's overlay

    other = await renter.stack(rental_id, ONE_SERVICE_ALL_GPUS, name="too big")
    refused = await renter.wait_stack(rental_id, other, (wire.APPLIED, wire.ERROR), timeout=60)
    assert refused and refused["status"] == wire.ERROR, refused
    assert "its GPUs are on 2 machines" in refused["errorMsg"] and "split it" in refused["errorMsg"], refused
    assert await both_running()

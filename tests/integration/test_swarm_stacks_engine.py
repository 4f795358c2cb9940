"""Stacks on a real two-node Swarm (scripts/swarm-cluster.sh) through the
agent's Swarm adapter (runtime/swarm_stacks.py) and its reading of the
manager's answers (runtime/swarm_tasks.py): the environment's GPUs come from
the nodes' generic resources, a stack deployed with `docker stack deploy`
is listed with its containers on both machines in the seed's shape, a
machine that stops taking tasks takes its GPUs out of service, and a
removed stack leaves nothing on either machine.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from support.settings import stack_context
from support.swarm import PREFIX, docker, set_availability

from gpuhost_agent.core.gpus.allocation import environment_slots
from gpuhost_agent.core.sandbox.context import GIB
from gpuhost_agent.core.sandbox.harden import harden
from gpuhost_agent.core.stacks.container_list import seed_containers
from gpuhost_agent.core.stacks.project_input import label_services
from gpuhost_agent.core.swarm.stack_file import SwarmPlacement, swarm_stack
from gpuhost_agent.inventory.swarm_nodes import environment_facts
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.engine.client import DockerEngine
from gpuhost_agent.runtime.swarm_stacks import SwarmStacks
from gpuhost_agent.runtime.swarm_tasks import NODE_LABEL, stack_containers

pytestmark = pytest.mark.swarm
BOX = {"image": "gpuhost-test/busybox:1", "command": ["sh", "-c", "trap exit TERM; sleep 3600 & wait"]}
GPU_ASK = {"resources": {"reservations": {"devices": [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]}}}


def cluster_gpu(node: int, index: int) -> str:
    """The stand-in GPU UUIDs scripts/swarm-cluster.sh gives each node."""
    return f"GPU-5a4d0000-0000-4000-8000-{node:06d}{index:06d}"


@pytest.fixture
def nodes(monkeypatch, shared_swarm) -> tuple[str, str]:
    """The shared cluster, and the agent's engine pointed at its manager."""
    monkeypatch.setenv("DOCKER_HOST", f"unix:///run/{PREFIX}/n1/docker.sock")
    return shared_swarm


async def test_the_environments_gpus_are_every_nodes_and_a_drained_machine_takes_its_out(nodes) -> None:
    manager, worker = nodes
    engine = DockerEngine()
    slots = environment_slots(await environment_facts(engine))
    assert {slot.uuid: slot.machine for slot in slots} == {
        cluster_gpu(1, 0): manager,
        cluster_gpu(1, 1): manager,
        cluster_gpu(2, 0): worker,
        cluster_gpu(2, 1): worker,
    }
    assert all(slot.healthy for slot in slots)
    await asyncio.to_thread(set_availability, worker, "drain")
    try:
        slots = environment_slots(await environment_facts(engine))
        out = {slot.uuid: slot.reason for slot in slots if not slot.healthy}
        assert set(out) == {cluster_gpu(2, 0), cluster_gpu(2, 1)}
        assert all(reason.endswith("is drain in the Swarm") for reason in out.values())
    finally:
        await asyncio.to_thread(set_availability, worker, "active")


async def test_a_stack_on_two_machines_is_listed_in_the_seed_shape_and_removed_from_both(nodes) -> None:
    manager, worker = nodes
    engine = DockerEngine()
    stacks = SwarmStacks(engine)
    where = {slot.uuid: slot.machine for slot in environment_slots(await environment_facts(engine))}
    gpu = cluster_gpu(2, 1)
    ctx = stack_context(project="stk1", gpu_uuids=(gpu,), cpus=1.0, memory_bytes=GIB // 2, pids_limit=512)
    model = {
        "services": {
            "train": {**BOX, "deploy": GPU_ASK, "ports": [{"target": 8080}]},
            "web": BOX,
            "once": {**BOX, "command": ["sh", "-c", "exit 3"], "restart": "no"},
        }
    }
    labelled = label_services(harden(model, ctx), "stack-1", "rental-1", "env-1", [gpu])
    stack, _ = swarm_stack(labelled, ctx, SwarmPlacement(gpu_nodes=where, home_node=manager))
    await stacks.deploy("stk1", json.dumps(stack))

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        raw = stack_containers(await stacks.services("stk1"), await stacks.tasks("stk1"))
        states = sorted(c["State"] for c in raw)
        if states == ["exited", "running", "running"] and all(c["Id"] for c in raw):
            break
        assert loop.time() < deadline, raw
        await asyncio.sleep(0.3)
    listed = {c["Name"].split(".")[0]: c for c in seed_containers(raw)}
    assert set(listed) == {"stk1_once", "stk1_train", "stk1_web"}
    assert listed["stk1_once"]["State"] == "exited (3)"
    for name, machine, node in (("stk1_train", 2, worker), ("stk1_web", 1, manager)):
        container = listed[name]
        assert container["State"] == "running"
        labels = dict(label.split("=", 1) for label in container["Labels"])
        assert labels[wire.LABEL_STACK] == "stack-1" and labels[wire.LABEL_RENTAL] == "rental-1"
        assert labels[NODE_LABEL] == node
        (info,) = json.loads(await asyncio.to_thread(docker, machine, "inspect", container["Id"]))
        assert info["State"]["Running"], name  # the Id is that machine's own container
    visible = json.loads(await asyncio.to_thread(docker, 2, "inspect", listed["stk1_train"]["Id"]))[0]
    assert f"NVIDIA_VISIBLE_DEVICES={gpu}" in visible["Config"]["Env"]
    assert [p["PrivatePort"] for p in listed["stk1_train"]["Ports"]] == [8080]
    assert listed["stk1_train"]["Ports"][0]["PublicPort"] > 0  # published on its machine, engine-picked

    await stacks.remove("stk1")
    assert await stacks.services("stk1") == []
    for machine in (1, 2):
        deadline = loop.time() + 30
        while left := await asyncio.to_thread(
            docker, machine, "ps", "-aq", "--filter", f"label={wire.LABEL_STACK}=stack-1"
        ):
            assert loop.time() < deadline, f"node {machine} still has {left}"
            await asyncio.sleep(0.5)

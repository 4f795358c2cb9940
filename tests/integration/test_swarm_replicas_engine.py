"""Replicas are bounded, on a real two-node Swarm (scripts/swarm-cluster.sh):
replicas are tasks on the rental's machine, and each one gets its part of the
rental's share there, so that replicas x limits fit the share; a stack whose
tasks would not get a usable part is refused before Swarm sees it."""

from __future__ import annotations

import json

import pytest
from support.sandbox_decide import RENTAL_GPUS
from support.settings import stack_context
from support.swarm import container_of, deploy, docker

from gpuhost_agent.core.sandbox.context import GIB
from gpuhost_agent.core.sandbox.harden import harden
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.core.swarm.stack_file import SwarmPlacement, swarm_stack

pytestmark = pytest.mark.swarm
CTX = stack_context(project="p", gpu_uuids=RENTAL_GPUS, cpus=1.0, memory_bytes=GIB // 2, pids_limit=512)
BOX = {"image": "gpuhost-test/busybox:1", "command": ["sh", "-c", "trap exit TERM; sleep 3600 & wait"]}


def _tasks(node: int, service: str) -> list[dict]:
    container_of(node, service)  # waits for the first one
    for _ in range(120):
        ids = docker(node, "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={service}").split()
        if len(ids) == 3:
            return json.loads(docker(node, "inspect", *ids))
        docker(node, "ps", "-q")  # a short pause on the engine itself
    raise AssertionError(docker(1, "service", "ps", service, check=False))


def test_replicas_divide_the_rentals_share_of_the_machine(shared_swarm) -> None:
    home, _other = shared_swarm
    hardened = harden({"services": {"web": {**BOX, "deploy": {"replicas": 3}}, "side": BOX}}, CTX)
    stack, _ = swarm_stack(hardened, CTX, SwarmPlacement({}, home_node=home))
    printed = deploy("replicas", json.dumps(stack))
    assert "Ignoring" not in printed, printed
    web = _tasks(1, "replicas_web")
    side = json.loads(docker(1, "inspect", container_of(1, "replicas_side")))
    limits = [task["HostConfig"] for task in web + side]
    assert len(limits) == 4
    assert sum(host["Memory"] for host in limits) <= CTX.memory_bytes
    assert sum(host["NanoCpus"] for host in limits) <= CTX.cpus * 10**9
    assert sum(host["PidsLimit"] for host in limits) <= CTX.pids_limit


def test_replicas_beyond_the_share_never_reach_swarm(shared_swarm) -> None:
    home, _other = shared_swarm
    hardened = harden({"services": {"web": {**BOX, "deploy": {"replicas": 20}}}}, CTX)
    with pytest.raises(StackRejected, match="deploy.replicas 20"):
        swarm_stack(hardened, CTX, SwarmPlacement({}, home_node=home))
    assert "replicas_web" not in docker(1, "service", "ls")

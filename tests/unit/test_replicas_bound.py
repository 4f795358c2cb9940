"""Replicas are containers on the machine. One stack runs
at most MAX_CONTAINERS on any host, services run replicated only, and on Swarm
each task gets its part of the rental's share of the machine (replicas x limits
fit it), or the stack is refused naming the count. On a real Swarm:
tests/integration/test_swarm_replicas_engine.py."""

from __future__ import annotations

import pytest
from support.settings import stack_context

from gpuhost_agent.core.sandbox.apply import decide
from gpuhost_agent.core.sandbox.context import GIB
from gpuhost_agent.core.sandbox.harden import harden
from gpuhost_agent.core.sandbox.make_safe import rewrite
from gpuhost_agent.core.sandbox.raw import RawReview
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.core.swarm.stack_file import SwarmPlacement, swarm_stack

CTX = stack_context(project="p", gpu_uuids=("GPU-a", "GPU-b"), cpus=8.0, memory_bytes=8 * GIB, pids_limit=4096)
PLACED = SwarmPlacement(gpu_nodes={"GPU-a": "n1", "GPU-b": "n1"}, home_node="n1")
MAX_CONTAINERS = 32  # sandbox_rewrite.MAX_CONTAINERS
MIN_TASK_MIB = 64  # swarm_rewrite.MIN_TASK_MEMORY


def _decided(services: dict) -> dict:
    return decide({"services": services}, RawReview(""), CTX)[0]


def _swarm(services: dict, placement: SwarmPlacement = PLACED) -> dict:
    return swarm_stack(_decided(services), CTX, placement)[0]


def test_replicas_share_the_rentals_share_of_the_machine() -> None:
    stack = _swarm({"web": {"image": "x", "deploy": {"replicas": 4}}, "db": {"image": "x"}})
    web, db = stack["services"]["web"]["deploy"], stack["services"]["db"]["deploy"]
    assert web["replicas"] == 4
    tasks = [(web["resources"]["limits"], 4), (db["resources"]["limits"], 1)]
    assert sum(int(limits["memory"]) * n for limits, n in tasks) <= CTX.memory_bytes
    assert sum(float(limits["cpus"]) * n for limits, n in tasks) <= CTX.cpus
    assert sum(limits["pids"] * n for limits, n in tasks) <= CTX.pids_limit
    # The rental's tasks of other stacks on that machine count too.
    crowded = _swarm({"web": {"image": "x", "deploy": {"replicas": 4}}}, SwarmPlacement({}, "n1", peers={"n1": 4}))
    assert int(crowded["services"]["web"]["deploy"]["resources"]["limits"]["memory"]) == CTX.memory_bytes // 8


def test_replicas_beyond_a_usable_slice_of_the_share_are_refused_naming_the_limit() -> None:
    many = SwarmPlacement({}, "n1", peers={"n1": 200})
    with pytest.raises(StackRejected) as refused:
        _swarm({"web": {"image": "x", "deploy": {"replicas": 2}}}, many)
    assert "deploy.replicas 2" in str(refused.value) and f"{MIN_TASK_MIB} MiB" in str(refused.value)


def test_a_task_asking_less_than_the_floor_is_not_refused_for_it() -> None:
    """The floor is on the share each task could have, not on what the renter
    asks: a service that wants 16 MiB (to be OOM-killed on purpose, or small
    by nature) runs with 16 MiB."""
    stack = _swarm({"small": {"image": "x", "mem_limit": str(16 * 2**20), "deploy": {"replicas": 2}}})
    assert int(stack["services"]["small"]["deploy"]["resources"]["limits"]["memory"]) == 16 * 2**20


@pytest.mark.parametrize(
    "service, words",
    [
        ({"image": "x", "deploy": {"replicas": 200}}, f"more than the {MAX_CONTAINERS}"),
        ({"image": "x", "scale": 200}, f"more than the {MAX_CONTAINERS}"),
        ({"image": "x", "deploy": {"replicas": "2"}}, "whole number"),
        ({"image": "x", "deploy": {"replicas": -1}}, "whole number"),
        ({"image": "x", "deploy": {"mode": "global"}}, "deploy.mode 'global'"),
        ({"image": "x", "deploy": {"mode": "replicated-job"}}, "deploy.mode 'replicated-job'"),
        ({"image": "x", "deploy": {"mode": "global-job"}}, "deploy.mode 'global-job'"),
    ],
)
def test_containers_of_a_stack_are_bounded_on_every_kind_of_host(service: dict, words: str) -> None:
    _model, _notices, problems = rewrite({"services": {"web": service}}, CTX)
    assert any(words in problem for problem in problems), problems


def test_a_stack_of_many_services_counts_every_container() -> None:
    services = {f"s{i}": {"image": "x", "deploy": {"replicas": 2}} for i in range(MAX_CONTAINERS // 2)}
    assert rewrite({"services": services}, CTX)[2] == []
    services["one-more"] = {"image": "x"}
    assert rewrite({"services": services}, CTX)[2]


def test_hardening_keeps_the_replicas_the_rewrite_allowed() -> None:
    hardened = harden({"services": {"web": {"image": "x", "deploy": {"replicas": 3}}}}, CTX)
    assert hardened["services"]["web"]["deploy"]["replicas"] == 3

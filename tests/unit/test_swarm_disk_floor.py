"""The host's disk floor in a Swarm environment (GPUHOST_DISK_FLOOR): a stack
is refused when a machine it would run on has less free disk than the floor,
as that machine's agent last reported it; the leader's own disk is measured
at the deploy, as on one machine (test_sandbox_pure.py). A stack that runs
elsewhere is not held back by a full machine, and a refused stack takes no
GPU."""

from __future__ import annotations

import asyncio

import pytest
from support.machine_samples import good_host
from support.settings import sandbox_for

from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.sandbox.apply import review_raw
from gpuhost_agent.core.sandbox.context import GIB, StackSite
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.core.swarm.placement import SwarmPlacer
from gpuhost_agent.core.swarm.stack_file import stack_nodes
from gpuhost_agent.protocol import wire, wire_jobs
from gpuhost_agent.storage.agent_db import AgentDB

GPU_SERVICE = {
    "image": "busybox",
    "networks": {"default": None},
    "deploy": {"resources": {"reservations": {"devices": [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]}}},
}


def _facts(worker_free: int) -> dict:
    """The leader (node-1, no GPU) and gpu-2 (node-2, one GPU, `worker_free` bytes free as it reported)."""
    leader = good_host()
    leader["host"]["docker"]["swarm"] = {"state": "active", "nodeId": "node-1", "manager": True, "nodes": 2}
    worker = good_host()
    worker["host"]["storage"]["freeBytes"] = worker_free
    leader["environment"] = {
        "nodes": [
            {"nodeId": "node-1", "hostname": "gpu-1", "state": "ready", "availability": "active", "gpus": []},
            {"nodeId": "node-2", "hostname": "gpu-2", "state": "ready", "availability": "active", "gpus": ["G3"]},
        ],
        "gpus": 1,
        "error": None,
    }
    leader["environment"]["nodes"][0]["machine"] = {"this": True}
    leader["environment"]["nodes"][1]["machine"] = {"systemData": worker}
    return leader


async def _ledger(tmp_path) -> GpuLedger:
    return GpuLedger(await asyncio.to_thread(AgentDB, tmp_path / "agent.db"))


async def _apply(ledger: GpuLedger, worker_free: int, service: dict, gpus: int) -> dict:
    async def facts() -> dict:
        return _facts(worker_free)

    async def peers(rental_id: str, project: str) -> dict[str, int]:
        return {}

    sandbox = sandbox_for(ledger, facts, placement=SwarmPlacer(peers, disk_floor_bytes=GIB), disk_floor_bytes=GIB)
    text = "services:\n  app:\n    image: busybox\n"
    model = {"name": "p", "services": {"app": service}, "networks": {"default": {"name": "p_default"}}}
    job = wire_jobs.StackJob("job-1", wire.JOB_DEPLOY, "stack-1", "rental-1", "env-1", "s", {"content": text}, gpus)
    hardened, _, _ = await sandbox.apply(job, model, review_raw(text), StackSite(project="p"))
    return hardened


async def test_a_stack_on_a_machine_below_the_floor_is_refused_naming_it(tmp_path) -> None:
    ledger = await _ledger(tmp_path)
    with pytest.raises(StackRejected, match=r"machine gpu-2's disk is nearly full: 0\.5 GiB free .* floor of 1\.0 GiB"):
        await _apply(ledger, GIB // 2, GPU_SERVICE, gpus=1)
    assert ledger.assignments == {}  # the refused stack took no GPU
    hardened = await _apply(ledger, 2 * GIB, GPU_SERVICE, gpus=1)  # room there: it goes
    assert stack_nodes(hardened) == {"node-2"} and ledger.assignments == {"rental-1": ["G3"]}


async def test_a_full_machine_does_not_hold_back_a_stack_that_runs_elsewhere(tmp_path) -> None:
    ledger = await _ledger(tmp_path)
    hardened = await _apply(ledger, GIB // 2, {"image": "busybox", "networks": {"default": None}}, gpus=0)
    assert stack_nodes(hardened) == {"node-1"} and ledger.assignments == {}

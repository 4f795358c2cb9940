"""A deleted or corrupted state file: rebuilt, no duplicate containers.

The agent stops with a GPU rental's stack running; its state database is then
deleted, or overwritten with garbage. The next agent on the same state
directory starts afresh (with a warning, and the corrupt file kept aside),
takes the rental's GPU back from the containers' labels at its first
reconcile, leaves the running stack alone, and never hands that GPU to
another rental.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest
from support.agent_process import Market, start_in_process
from support.engine import remove_env_resources
from support.renter import Renter
from support.stacks import SLEEPER, TEST_IMAGE
from support.waiting import until

from gpuhost_agent.core.reconcile.plan import DEPLOY, REMOVE
from gpuhost_agent.protocol import wire
from gpuhost_agent.service.daemon import stop_agent
from gpuhost_agent.storage.agent_db import DB_FILE


@pytest.fixture
async def world(tmp_path, monkeypatch, docker_client):
    """A `Market` and start() -> parts: an in-process agent on a stand-in machine of
    2 H100 GPUs, always on the same state directory; the last one is stopped at the end."""
    from support.fake_nvml import build_lib, forget_loaded_nvml, h100_sxm, write_config

    nvml_config = await asyncio.to_thread(write_config, tmp_path / "nvml.conf", h100_sxm(2))
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(nvml_config))
    market = Market(tmp_path / "market.json")
    await market.start()
    running = []

    async def start():
        nvml_library = str(await asyncio.to_thread(build_lib))
        parts, task = await start_in_process(
            market,
            tmp_path / "state",
            nvml_library=nvml_library,
            location="EU-DE-Frankfurt",
            gpu_check_image=TEST_IMAGE,
            reconcile_grace_seconds=4,
        )
        running.append((parts, task))
        return parts

    async def stop():
        parts, task = running.pop()
        await stop_agent(parts, task)

    http = aiohttp.ClientSession()
    try:
        yield Renter(http, market.base_url, market.store), market, start, stop
    finally:
        await http.close()
        while running:
            await stop()
        await market.stop()
        await asyncio.to_thread(remove_env_resources, docker_client, market.store.envId)
        await asyncio.to_thread(forget_loaded_nvml)


def _container_ids(docker_client, stack_id: str) -> list[str]:
    return sorted(
        c["Id"] for c in docker_client.api.containers(all=True, filters={"label": [f"{wire.LABEL_STACK}={stack_id}"]})
    )


async def _deploy(renter: Renter, rental_id: str) -> tuple[str, dict]:
    stack_id = await renter.stack(rental_id, SLEEPER)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=30)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    return stack_id, stack


@pytest.mark.parametrize("damage", ["deleted", "corrupted"])
async def test_state_file_rebuilt_without_duplicates(world, docker_client, tmp_path, damage):
    renter, market, start, stop = world
    parts = await start()
    rental_1 = await renter.rental(gpu_count=1)
    stack_1, first = await _deploy(renter, rental_1)
    [deploy_1] = [job for job in market.store.jobs.values() if job.stackId == stack_1]
    await until(lambda: deploy_1.state == "completed", timeout=10)
    gpus_1 = parts.reconciler.ledger.assignments[rental_1]
    assert len(gpus_1) == 1 and first["assignedGPUs"] == gpus_1
    ids = await asyncio.to_thread(_container_ids, docker_client, stack_1)
    assert len(ids) == 1
    await stop()

    db_file = tmp_path / "state" / DB_FILE
    assert await asyncio.to_thread(db_file.exists)
    if damage == "deleted":
        for suffix in ("", "-wal", "-shm"):
            await asyncio.to_thread(Path(f"{db_file}{suffix}").unlink, missing_ok=True)
    else:
        size = max((await asyncio.to_thread(db_file.stat)).st_size, 8192)
        await asyncio.to_thread(db_file.write_bytes, b"not a database\x00" + os.urandom(size))

    parts = await start()
    assert parts.db.rebuilt_because, "the new agent did not notice it started afresh"
    if damage == "corrupted":
        assert "unreadable" in parts.db.rebuilt_because, parts.db.rebuilt_because
        assert await asyncio.to_thread(lambda: list(db_file.parent.glob(f"{DB_FILE}.corrupt-*"))), (
            "the corrupt file was not kept aside"
        )
    assert parts.reconciler.ledger.assignments == {}  # nothing on record yet

    await until(lambda: parts.reconciler.runs >= 1, timeout=20)
    assert parts.reconciler.ledger.assignments.get(rental_1) == gpus_1  # taken back from the labels
    assert (parts.db.stacks().get(stack_1) or {}).get("status") == wire.APPLIED
    await until(lambda: parts.reconciler.runs >= 2, timeout=10)  # and a second run changes nothing either
    assert not [a for a in parts.reconciler.last_actions if a.kind in (DEPLOY, REMOVE)], parts.reconciler.last_actions
    assert await asyncio.to_thread(_container_ids, docker_client, stack_1) == ids  # no duplicate, no redeploy
    assert all(
        c.status == "running"
        for c in await asyncio.to_thread(
            docker_client.containers.list, all=True, filters={"label": f"{wire.LABEL_STACK}={stack_1}"}
        )
    )
    history = [status for status, _at in market.store.stacks[stack_1]["history"]]
    assert history.count(wire.APPLIED) == 1 and history[-1] == wire.APPLIED, history
    assert [job.jobId for job in market.store.jobs.values() if job.stackId == stack_1] == [deploy_1.jobId]

    # A second rental gets the other GPU, never rental 1's.
    rental_2 = await renter.rental(gpu_count=1)
    stack_2, second = await _deploy(renter, rental_2)
    [now_1] = [s for s in await renter.stacks(rental_1) if s["stackId"] == stack_1]
    assert now_1["assignedGPUs"] == gpus_1
    assert len(second["assignedGPUs"]) == 1 and not set(second["assignedGPUs"]) & set(now_1["assignedGPUs"]), (
        second["assignedGPUs"],
        now_1["assignedGPUs"],
    )
    assert parts.reconciler.ledger.assignments == {rental_1: gpus_1, rental_2: second["assignedGPUs"]}
    assert await asyncio.to_thread(_container_ids, docker_client, stack_1) == ids
    assert len(await asyncio.to_thread(_container_ids, docker_client, stack_2)) == 1
    assert parts.outbox.rejected == 0

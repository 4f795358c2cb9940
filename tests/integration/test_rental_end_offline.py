"""A rental whose endDate passes while the marketplace is down.

The host enforces the end by its own clock: the rental's containers are
removed on time and its GPU freed, with nobody to ask. When the marketplace
is back it hears the removals from the outbox, the rental is COMPLETE, every
job completes, and a deploy for the ended rental is refused.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import aiohttp
import pytest
from support.agent_process import Market, start_in_process
from support.engine import remove_env_resources
from support.renter import Renter
from support.stacks import SLEEPER, TEST_IMAGE
from support.waiting import until

from gpuhost_agent.core.init_state import READY
from gpuhost_agent.protocol import wire, wire_time
from gpuhost_agent.service.daemon import stop_agent

END_AFTER = timedelta(seconds=9)  # room for the deploy (and the marketplace's stop) before the end
LATE_BY_AT_MOST = 3.0


class ReportsRejected(AssertionError):
    """The failure this test guards against, named apart from the other assertions."""


@pytest.fixture
async def gpu_world(tmp_path, monkeypatch, docker_client):
    """A `Market` and an in-process agent on a stand-in machine of 2 H100 GPUs."""
    from support.fake_nvml import build_lib, forget_loaded_nvml, h100_sxm, write_config

    nvml_config = await asyncio.to_thread(write_config, tmp_path / "nvml.conf", h100_sxm(2))
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(nvml_config))
    market = Market(tmp_path / "market.json")
    await market.start()
    nvml_library = str(await asyncio.to_thread(build_lib))
    parts, task = await start_in_process(
        market,
        tmp_path / "state",
        nvml_library=nvml_library,
        location="EU-DE-Frankfurt",
        gpu_check_image=TEST_IMAGE,
        reconcile_grace_seconds=4,
    )
    http = aiohttp.ClientSession()
    try:
        yield Renter(http, market.base_url, market.store), market, parts
    finally:
        await http.close()
        await stop_agent(parts, task)
        await market.stop()
        await asyncio.to_thread(remove_env_resources, docker_client, market.store.envId)
        await asyncio.to_thread(forget_loaded_nvml)


def _rental_containers(docker_client, rental_id: str) -> list[tuple[str, str]]:
    return [
        (c["Id"], c["State"])
        for c in docker_client.api.containers(all=True, filters={"label": [f"{wire.LABEL_RENTAL}={rental_id}"]})
    ]


async def _watch_until_gone(docker_client, rental_id: str, timeout: float) -> tuple[list, object]:
    """Samples (time, containers) every 0.1 s until the rental has none; returns them and when it had none."""
    samples = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        now = wire_time.utcnow()
        seen = await asyncio.to_thread(_rental_containers, docker_client, rental_id)
        samples.append((now, seen))
        if not seen:
            return samples, now
        await asyncio.sleep(0.1)
    raise AssertionError(f"the rental's containers were still there after {timeout}s: {samples[-1]}")


async def test_rental_end_while_marketplace_down(gpu_world, docker_client):
    renter, market, parts = gpu_world
    ledger = parts.reconciler.ledger
    await until(lambda: parts.host.init.state == READY, timeout=20)

    end = wire_time.utcnow() + END_AFTER
    status, body = await renter.call(
        "POST",
        "/rentals",
        {"envId": market.store.envId, "name": "ends soon", "gpuCount": 1, "endDate": wire_time.iso(end)},
    )
    assert status == 201, body
    rental_id = body["rentalId"]
    end = wire_time.parse_iso(market.store.rentals[rental_id]["endDate"])
    stack_id = await renter.stack(rental_id, SLEEPER)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=20)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    [deploy] = [job for job in market.store.jobs.values() if job.stackId == stack_id]
    await until(lambda: deploy.state == "completed", timeout=10)
    gpus = ledger.assignments[rental_id]
    assert len(gpus) == 1 and stack["assignedGPUs"] == gpus

    await market.stop()
    assert wire_time.utcnow() < end - timedelta(seconds=1), "too slow: the end came before the marketplace was stopped"
    assert market.store.rentals[rental_id]["status"] == wire.RENTAL_ACTIVE

    samples, gone_at = await _watch_until_gone(
        docker_client, rental_id, timeout=(end - wire_time.utcnow()).total_seconds() + 10
    )
    before_end = [seen for moment, seen in samples if moment < end]
    assert before_end and all(seen and all(state == "running" for _id, state in seen) for seen in before_end), (
        "the rental's containers were touched before its end"
    )
    late = (gone_at - end).total_seconds()
    print(f"containers gone {late:.2f}s after the end")
    assert 0 <= late <= LATE_BY_AT_MOST, f"containers gone {late:.2f}s after the end"
    await until(lambda: rental_id not in ledger.assignments and ledger.has_ended(rental_id), timeout=5)
    assert rental_id in parts.agent.rental_clock.ended
    assert parts.outbox.pending() > 0  # REMOVED waits for the marketplace

    # Back, the marketplace ends the rental itself and queues a removal of the stack, not having heard
    # REMOVED. Its reports being retried sooner than its job poll, the agent is heard first (made
    # certain here: no job is handed out until the stack is gone), then it gets that removal.
    market.store.deliverable = lambda max_jobs: []
    await market.start()
    await renter.wait_stack(rental_id, stack_id, (), timeout=30)  # gone from the renter's list
    del market.store.deliverable  # the store's own method again
    market.state.changed(jobs=True)
    status, rental = await renter.call("GET", f"/rentals/{rental_id}")
    assert status == 200 and rental["status"] == wire.RENTAL_COMPLETE, rental
    await until(
        lambda: all(job.state == "completed" for job in market.store.jobs.values()) and parts.outbox.pending() == 0,
        timeout=30,
    )
    outcomes = {(job.type, job.outcome, job.errorMsg) for job in market.store.jobs.values()}
    assert {outcome for _type, outcome, _msg in outcomes} == {wire.OUTCOME_SUCCEEDED}, outcomes
    assert stack_id not in market.store.containers
    rejected_on_return = parts.outbox.rejected

    # A deploy for the ended rental arriving late (queued by a marketplace whose
    # clock is behind, say) is refused, and nothing runs.
    record = market.store.rentals[rental_id]
    record["status"] = wire.RENTAL_ACTIVE  # let the store queue it as a renter's request just before the end
    late_stack = market.store.create_stack(
        rental_id, {"name": "late", "description": "too late", "content": SLEEPER, "environmentVariables": {}}
    )
    record["status"] = wire.RENTAL_COMPLETE
    market.state.changed(jobs=True)
    [late_deploy] = [job for job in market.store.jobs.values() if job.stackId == late_stack["stackId"]]
    await until(lambda: late_deploy.state == "completed", timeout=15)
    assert late_deploy.outcome == wire.OUTCOME_FAILED
    assert "rental has ended" in (late_deploy.errorMsg or ""), late_deploy.errorMsg
    await until(lambda: market.store.stacks[late_stack["stackId"]]["status"] == wire.ERROR, timeout=10)
    assert "rental has ended" in market.store.stacks[late_stack["stackId"]]["errorMsg"]
    assert await asyncio.to_thread(_rental_containers, docker_client, rental_id) == []
    assert rental_id not in ledger.assignments
    assert parts.outbox.rejected == rejected_on_return  # the refusal itself is heard
    if rejected_on_return:
        raise ReportsRejected(f"{rejected_on_return} report(s) refused by the marketplace after its return")

"""Usage the host can trust: a real agent process on a
stand-in machine of 2 GPUs, a rental using both, the agent killed with
SIGKILL and the marketplace down for a while; the usage page must then count
each GPU-second of the rental once: no second lost to the kill or the outage,
none counted twice.

The bounds come from the test's own clock: at least the time from APPLIED
to the end request (the GPUs were surely the rental's then), at most the
time from the rental's creation to its GPUs being free again. The agent's
gap and the outage are each longer than that slack, so a gap counted twice,
or not at all, falls outside.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from support.agent_process import Market, process_world
from support.stacks import SLEEPER, TEST_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import wire

AWAY_SECONDS = 10.0  # the agent killed, then the marketplace down: each longer than the bounds' slack (about 8 s)


@pytest.fixture
async def world(tmp_path, monkeypatch, docker_client):
    from support.fake_nvml import build_lib, h100_sxm, write_config

    nvml_config = await asyncio.to_thread(write_config, tmp_path / "nvml.conf", h100_sxm(2))
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(nvml_config))
    library = str(await asyncio.to_thread(build_lib))
    settings = {"GPUHOST_NVML_LIBRARY": library, "GPUHOST_GPU_CHECK_IMAGE": TEST_IMAGE, "GPUHOST_USAGE_SECONDS": "1"}
    async with process_world(tmp_path, docker_client, **settings) as made:
        yield made


def _seconds_by_gpu(market: Market, rental_id: str) -> dict[str, list[float]]:
    sums: dict[str, list[float]] = {}
    for record in market.store.usage.values():
        if record["rentalId"] == rental_id:
            for uuid, figures in record["gpus"].items():
                total = sums.setdefault(uuid, [0.0] * 4)
                for index, value in enumerate(figures):
                    total[index] += value
    return sums


async def test_a_kill_9_and_a_marketplace_outage_count_each_gpu_second_once(world) -> None:
    renter, market, agent = world
    await agent.start()
    await until(lambda: market.state.heartbeat is not None, timeout=60)
    created = time.monotonic()
    rental_id = await renter.rental(gpu_count=2)
    stack_id = await renter.stack(rental_id, SLEEPER)
    await renter.wait_stack(rental_id, stack_id, (wire.APPLIED,), timeout=60)
    applied = time.monotonic()

    await asyncio.sleep(2)
    agent.process.kill()  # SIGKILL: no last count, no goodbye
    await agent.process.wait()
    await asyncio.sleep(AWAY_SECONDS)
    await market.stop()
    await agent.start()  # counts the time it was away, and on, with nobody to tell
    await asyncio.sleep(AWAY_SECONDS)
    await market.start()
    await asyncio.sleep(2)

    ending = time.monotonic()
    status, _ = await renter.call("DELETE", f"/rentals/{rental_id}")
    assert status == 200

    def freed() -> bool:
        assignments = market.store.live.get("gpuAssignments") or {}
        return len(assignments.get("free", [])) == 2 and not assignments.get("releasing")

    await until(freed, timeout=60)
    released = time.monotonic()

    def all_delivered() -> bool:  # the outbox may still be in its back-off (up to 30 s) from the outage
        usage = _seconds_by_gpu(market, rental_id)
        return len(usage) == 2 and all(figures[0] >= ending - applied for figures in usage.values())

    try:
        await until(all_delivered, timeout=60)
    except AssertionError:
        pass  # the assertions below say what arrived
    await asyncio.sleep(2)  # anything later, counted twice, would arrive now

    usage = _seconds_by_gpu(market, rental_id)
    assert len(usage) == 2, usage
    for uuid, (seconds, busy, lost, offline) in usage.items():
        assert ending - applied <= seconds <= released - created, (uuid, seconds, ending - applied, released - created)
        assert lost == offline == 0 and busy <= seconds
    assert "usage_gap_counted" in await asyncio.to_thread(agent.logs)

    status, page = await renter.call("GET", f"/environments/{market.store.envId}/usage")
    assert status == 200
    assert page["total"]["count"] == 1
    assert page["total"]["hours"] == pytest.approx(sum(u[0] for u in usage.values()) / 3600, abs=1e-5)

"""The agent as a real process under log floods, and its channel across a
marketplace restart.

The agent runs as `gpuhost-agent run` (tests/support/agent_process.py) so its resident
memory can be measured on its own, apart from the marketplace and the test.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import psutil
import pytest
from support.agent_process import AgentProcess, Market
from support.engine import remove_env_resources
from support.renter_streams import STDOUT, SYSTEM, Demux, logs_path, read_logs
from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import wire

FLOOD_SECONDS = 10
STALL_SECONDS = 15
# Lines of a kilobyte: the engine's cost is mostly per line, so the flood's bytes
# outrun every buffer on the way even when a loaded machine halves its line rate
# (with 60-byte lines, a loaded run stored so little that the buffers held it all).
FLOOD_LINE = "a line of flood output, a kilobyte long, printed fast " + "x" * 970
FLOOD = f"""
services:
  flood:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "sleep 1; timeout {FLOOD_SECONDS} yes '{FLOOD_LINE}'; exec sleep 3600"]
    stop_grace_period: 1s
"""
QUIET = f"""
services:
  quiet:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "echo hello-from-quiet; exec sleep 3600"]
    stop_grace_period: 1s
"""


@pytest.fixture
async def world(tmp_path, docker_client):
    market = Market(tmp_path / "market.json")
    await market.start()
    # Logs capped far above the flood: Docker 20.10's follow stops at a rotation when its reader is
    # behind (moby/moby#37646; docs/streams.md), which is not what these tests measure.
    agent = await asyncio.to_thread(AgentProcess, tmp_path, market, GPUHOST_LOG_MAX_SIZE="1g")
    await agent.start()
    http = aiohttp.ClientSession()
    try:
        yield market, agent, http
    finally:
        await http.close()
        await agent.stop()
        await market.stop()
        await asyncio.to_thread(remove_env_resources, docker_client, market.store.envId)


async def _renter(http, market, method, path, body=None):
    async with http.request(
        method, market.base_url + path, json=body, headers={wire.API_KEY_HEADER: market.store.renterApiKey}
    ) as response:
        return response.status, await response.json(content_type=None)


async def _deploy(http, market, content: str) -> tuple[str, str, dict]:
    status, rental = await _renter(http, market, "POST", "/rentals", {"envId": market.store.envId, "name": "load"})
    assert status == 201, rental
    template = {"name": "load", "description": "load", "content": content, "environmentVariables": {}}
    status, stack_id = await _renter(
        http, market, "POST", f"/rentals/{rental['rentalId']}/stacks", {"template": template}
    )
    assert status == 201, stack_id
    await until(lambda: market.store.stacks[stack_id]["status"] == wire.APPLIED, timeout=60)
    await until(lambda: market.store.containers.get(stack_id, {}).get("containers"), timeout=10)
    (container,) = market.store.containers[stack_id]["containers"]
    return rental["rentalId"], stack_id, container


async def test_log_flood_keeps_agent_memory_bounded_and_marks_drops(world):
    market, agent, http = world
    rental_id, stack_id, container = await _deploy(http, market, FLOOD)
    process = await asyncio.to_thread(psutil.Process, agent.process.pid)
    baseline = (await asyncio.to_thread(process.memory_info)).rss
    url = market.base_url + logs_path(rental_id, stack_id, container["Id"])
    headers = {wire.API_KEY_HEADER: market.store.renterApiKey}
    peak = baseline
    fast, stalled = Demux(), Demux()

    async def sample_rss():
        nonlocal peak
        while True:
            peak = max(peak, (await asyncio.to_thread(process.memory_info)).rss)
            await asyncio.sleep(0.1)

    async def follow(demux: Demux, stall: float, until: float):
        """Read until `until` (the reader need not catch up with everything
        Docker stored: the engine decodes its log slower than `yes` prints)."""
        async with http.get(url, params={"follow": "true"}, headers=headers) as response:
            assert response.status == 200
            if stall:
                await asyncio.sleep(stall)  # a renter who stops reading: the agent must not buffer for them
            while time.monotonic() < until:
                try:
                    chunk = await asyncio.wait_for(response.content.readany(), 1)
                except asyncio.TimeoutError:
                    continue
                if not chunk:
                    return
                demux.feed(chunk)

    # The stalled reader stops for longer than every buffer on the way (the
    # loopback sockets' buffers fill in a few seconds at this rate) plus the
    # agent's LOG_STALL_SECONDS, so the agent has to drop, and say so.
    started = time.monotonic()
    sampler = asyncio.create_task(sample_rss())
    try:
        await asyncio.gather(
            follow(fast, 0, started + FLOOD_SECONDS + 2), follow(stalled, STALL_SECONDS, started + STALL_SECONDS + 4)
        )
    finally:
        sampler.cancel()
    growth_mb = (peak - baseline) / 2**20
    print(
        f"agent RSS: baseline {baseline / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB (+{growth_mb:.1f});"
        f" fast reader {len(fast.frames)} frames, stalled reader {len(stalled.frames)} frames"
    )
    assert growth_mb < 64, f"agent memory grew by {growth_mb:.1f} MiB under a log flood"
    # 20 000 kilobyte lines: more than every socket buffer on the way holds, at half an idle machine's rate
    assert len(fast.frames) > 20_000, "the fast reader got the flood"
    markers = [payload.decode() for kind, payload in stalled.frames if kind == SYSTEM]
    assert any("dropped" in marker for marker in markers), markers[:5]
    dropped = sum(int(marker.split()[1]) for marker in markers if "dropped" in marker)
    received = sum(1 for kind, _payload in stalled.frames if kind == STDOUT)
    assert dropped > 0 and received > 0, (dropped, received)


async def test_channel_survives_marketplace_restart(world):
    market, agent, http = world
    rental_id, stack_id, container = await _deploy(http, market, QUIET)
    path = logs_path(rental_id, stack_id, container["Id"])
    status, demux, _ = await read_logs(http, market.base_url, market.store.renterApiKey, path)
    assert status == 200 and demux.lines(STDOUT) == ["hello-from-quiet"]

    await market.stop()
    await asyncio.sleep(1.0)
    await market.start()  # same port, same store: the agent must come back by itself
    deadline = time.monotonic() + 30
    while True:
        status, demux, _ = await read_logs(http, market.base_url, market.store.renterApiKey, path)
        if status == 200:
            break
        assert status in (503, 504), status
        assert time.monotonic() < deadline, "the agent did not reopen its channel"
        await asyncio.sleep(0.3)
    assert demux.lines(STDOUT) == ["hello-from-quiet"]

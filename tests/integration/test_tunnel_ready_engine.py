"""A tunnel's status says `ready` once its service listens, though nobody
connected: the marketplace probes `starting` tunnels in
the background, through the agent's tunnel path, a bounded number of times."""

from __future__ import annotations

import asyncio
import subprocess

from support.stacks import TEST_IMAGE

from gpuhost_agent.local_marketplace.tunnels import probes as tunnel_probes
from gpuhost_agent.protocol import wire

# One service listens four seconds after it starts, the other never does.
LATE = f"""
services:
  late:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "sleep 4 && mkdir -p /www && echo late > /www/index.html && exec httpd -f -p 8080 -h /www"]
    expose: ["8080"]
    stop_grace_period: 1s
  never:
    image: {TEST_IMAGE}
    command: ["sleep", "100000"]
    expose: ["9000"]
    stop_grace_period: 1s
"""


async def test_a_tunnel_turns_ready_without_a_client_and_the_probes_stop(local_market):
    renter, _parts, local = local_market
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, LATE, name="late")
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    found = {t["service"]: t for t in await renter.tunnels(rental_id, stack_id, 2)}
    assert found["late"]["status"] == "starting", "APPLIED before the service listens"

    ready = await renter.tunnels(rental_id, stack_id, 1, lambda t: t["status"] == "ready", timeout=30)
    assert ready[0]["service"] == "late", ready
    never = await renter.tunnels(rental_id, stack_id, 1, lambda t: t["service"] == "never")
    assert never[0]["status"] == "starting"
    # and it really is: curl gets the page on the first try
    page = await asyncio.to_thread(
        subprocess.run, ["curl", "-sS", "--max-time", "10", ready[0]["url"]], capture_output=True, text=True
    )
    assert page.stdout.strip() == "late"

    book = local.state.tunnels
    left = book.probes.left[stack_id]
    assert 0 <= left < tunnel_probes.PROBES_PER_STACK, "the probes are counted"
    await asyncio.sleep(2)
    assert book.probes.left[stack_id] <= left, "bounded: a budget that only goes down"

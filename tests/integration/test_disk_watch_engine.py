"""A rental's share of Docker's disk, measured on the real engine:
a rental whose container writes past its share is stopped and its stack
reported ERROR naming the use and the limit; another rental's stack runs on.
(The sums and shares alone: tests/unit/test_disk_watch.py.)"""

from __future__ import annotations

import asyncio

from support.stacks import TEST_IMAGE

from gpuhost_agent.protocol import wire

SHARE = 20 * 1024**2  # GPUHOST_RENTAL_DISK for the test: 20 MiB per rental
WRITER = f"""
services:
  writer:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "dd if=/dev/zero of=/big bs=1M count=40 2>/dev/null; exec sleep 3600"]
"""
QUIET = f"""
services:
  quiet:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
"""


async def test_a_rental_writing_past_its_disk_share_is_stopped_with_the_reason(gpu_agent, docker_client):
    renter, parts, _local, _ = await gpu_agent(gpus=2, rental_disk_bytes=SHARE, disk_watch_seconds=1.0)
    greedy, modest = await renter.rental(gpu_count=1), await renter.rental(gpu_count=1)
    quiet_id = await renter.stack(modest, QUIET)
    writer_id = await renter.stack(greedy, WRITER)
    stack = await renter.wait_stack(greedy, writer_id, (wire.ERROR,), timeout=60)
    assert "stopped: the rental's containers and volumes use 0.04 GiB of the host's disk" in stack["errorMsg"]
    assert "above its share of 0.02 GiB" in stack["errorMsg"]
    (writer,) = await asyncio.to_thread(
        docker_client.containers.list, all=True, filters={"label": f"{wire.LABEL_STACK}={writer_id}"}
    )
    for _ in range(100):  # ERROR is said first, then the containers are stopped (their stop timeout)
        await asyncio.to_thread(writer.reload)
        if writer.status == "exited":
            break
        await asyncio.sleep(0.1)
    assert writer.status == "exited"
    quiet = next(s for s in await renter.stacks(modest) if s["stackId"] == quiet_id)
    assert quiet["status"] == wire.APPLIED and quiet["errorMsg"] == ""
    assert (await renter.containers(modest, quiet_id))[0]["State"] == "running"
    await asyncio.sleep(2)  # a later measurement leaves the stopped rental as it is
    stack = next(s for s in await renter.stacks(greedy) if s["stackId"] == writer_id)
    assert stack["status"] == wire.ERROR and "above its share" in stack["errorMsg"]

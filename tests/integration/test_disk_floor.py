"""Free disk below the host's floor stops new deploys with a clear ERROR,
before any pull, container or GPU is taken; measured on this
machine's real Docker disk, with a floor set above what it has free."""

from __future__ import annotations

import asyncio
import shutil

from support.stacks import TEST_IMAGE

from gpuhost_agent.protocol import wire

STACK = f"services:\n  app:\n    image: {TEST_IMAGE}\n    command: ['sleep', '3600']\n"


async def test_a_deploy_below_the_disk_floor_is_refused_naming_the_floor(gpu_agent, docker_client):
    root = (await asyncio.to_thread(docker_client.info))["DockerRootDir"]
    free = (await asyncio.to_thread(shutil.disk_usage, root)).free
    floor = free + 50 * 1024**3
    renter, parts, _local, _ = await gpu_agent(gpus=2, disk_floor_bytes=floor)
    rental_id = await renter.rental(gpu_count=1)
    stack_id = await renter.stack(rental_id, STACK)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=30)
    assert stack["status"] == wire.ERROR
    assert "the host's disk is nearly full" in stack["errorMsg"] and root in stack["errorMsg"]
    assert f"floor of {floor / 1024**3:.1f} GiB (GPUHOST_DISK_FLOOR)" in stack["errorMsg"]
    created = await asyncio.to_thread(
        docker_client.containers.list, all=True, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}
    )
    assert created == [] and rental_id not in parts.deployer.sandbox.ledger.assignments

"""The host probe against the real Docker Engine and Compose CLI. (The toolkit
detection and an unreachable engine: tests/unit/test_host_probe.py.)"""

from __future__ import annotations

import asyncio
import os

from support.stacks import TEST_IMAGE

from gpuhost_agent.inventory.host_probe import probe_host
from gpuhost_agent.runtime.compose import find_compose_command
from gpuhost_agent.runtime.engine.client import DockerEngine


async def test_probe_of_this_host_against_the_real_engine(docker_client) -> None:
    engine = DockerEngine()
    try:
        host = await probe_host(engine, await asyncio.to_thread(find_compose_command), gpu_check_image=TEST_IMAGE)
    finally:
        await engine.close()
    info = await asyncio.to_thread(docker_client.info)
    assert host["docker"]["available"] and host["docker"]["version"] == info["ServerVersion"]
    assert host["storage"]["path"] == info["DockerRootDir"] and host["storage"]["freeBytes"] > 0
    assert host["compose"]["available"] and host["compose"]["version"].startswith("2.")
    assert host["cpu"]["logicalCores"] == os.cpu_count()
    assert host["memory"]["totalBytes"] > 0 and host["os"]["kernel"] == os.uname().release
    # A real container with every GPU requested, through the stand-in NVIDIA hook of the test dockerd.
    assert host["docker"]["gpuContainers"] == {"ok": True, "method": "container", "image": TEST_IMAGE, "detail": None}
    assert not await asyncio.to_thread(
        docker_client.containers.list, all=True, filters={"label": "io.gpuhost.managed=check"}
    )


async def test_gpu_check_with_an_image_that_is_not_on_the_host(docker_client) -> None:
    engine = DockerEngine()
    try:
        host = await probe_host(engine, None, gpu_check_image="127.0.0.1:5000/not/here:1")
    finally:
        await engine.close()
    check = host["docker"]["gpuContainers"]
    assert check["ok"] is False and "not/here" in check["detail"]
    assert host["compose"] == {
        "available": False,
        "version": None,
        "command": None,
        "error": "Docker Compose v2 not found",
    }

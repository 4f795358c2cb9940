"""A renter's stack, end to end: create → APPLIED → containers listed → remove → gone."""

from __future__ import annotations

import asyncio

import aiohttp
from support.engine import env_containers
from support.stacks import TEST_IMAGE

from gpuhost_agent.common import logs
from gpuhost_agent.protocol import wire

WEB_STACK = f"""
services:
  web:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /www && echo \\"$$GREETING\\" > /www/index.html && exec httpd -f -p 8080 -h /www"]
    environment:
      GREETING: ${{GREETING}}
    ports: ["127.0.0.1::8080"]
    stop_grace_period: 1s
  worker:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
    volumes: ["/scratch"]
    stop_grace_period: 1s
"""


async def test_deploy_list_remove(local_market, docker_client):
    renter, parts, local = local_market
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, WEB_STACK, {"GREETING": "hello from the stack"}, name="My Web!")

    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR))
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    assert stack["errorMsg"] == ""
    assert "hello from the stack" in logs.SECRETS, "template values are scrubbed from logs while the stack lives"
    assert stack["pStackName"].startswith("my-web-") and stack_id[:8] in stack["pStackName"]
    assert isinstance(stack["pStackId"], int) and stack["pStackId"] > 0
    seed_stack_keys = {
        "template",
        "createdAt",
        "updatedAt",
        "stackId",
        "envId",
        "stackName",
        "pStackName",
        "pStackId",
        "userId",
        "rentalId",
        "tunnels",
        "errorMsg",
        "status",
    }
    assert set(stack) == seed_stack_keys | {"assignedGPUs"}  # the one addition: the rental's GPUs

    containers = await _eventually(lambda: renter.containers(rental_id, stack_id), lambda c: len(c) == 2)
    assert [c["Name"] for c in containers] == sorted(c["Name"] for c in containers)
    for container in containers:
        assert set(container) == {"Name", "Id", "Created", "Labels", "Ports", "State"}
        assert isinstance(container["Created"], int) and isinstance(container["Id"], str)
        assert all(isinstance(label, str) and "=" in label for label in container["Labels"])
        assert f"{wire.LABEL_STACK}={stack_id}" in container["Labels"]
        assert f"{wire.LABEL_RENTAL}={rental_id}" in container["Labels"]
        assert f"{wire.LABEL_ENV}={renter.store.envId}" in container["Labels"]
        assert container["State"] == "running"
    web = next(c for c in containers if "-web-" in c["Name"])
    (port,) = web["Ports"]
    assert port["PrivatePort"] == 8080 and port["Type"] == "tcp" and port["IP"] == "127.0.0.1"
    assert isinstance(port["PublicPort"], int) and port["PublicPort"] > 0

    # The published port really serves what the template's variable said.
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port['PublicPort']}/") as response:
            assert (await response.text()).strip() == "hello from the stack"

    worker = await asyncio.to_thread(
        docker_client.containers.get, next(c["Id"] for c in containers if "-worker-" in c["Name"])
    )
    (scratch,) = [m["Name"] for m in worker.attrs["Mounts"] if m["Type"] == "volume"]

    status, removing = await renter.call("DELETE", f"/rentals/{rental_id}/stacks/{stack_id}")
    assert status == 200 and removing["status"] == wire.REMOVING
    await renter.wait_stack(rental_id, stack_id, (), timeout=30)
    assert await asyncio.to_thread(env_containers, docker_client, renter.store.envId) == []
    assert (
        await asyncio.to_thread(
            docker_client.networks.list, filters={"label": f"com.docker.compose.project={stack['pStackName']}"}
        )
        == []
    )
    assert scratch not in [v.name for v in await asyncio.to_thread(docker_client.volumes.list)], (
        "the anonymous volume must go too"
    )
    assert not await asyncio.to_thread((parts.deployer.stacks_dir / stack_id).exists)
    assert "hello from the stack" not in logs.SECRETS, "a removed stack's values are released"


async def test_ending_rental_removes_its_stacks(local_market, docker_client):
    renter, _parts, _local = local_market
    rental_id = await renter.rental()
    content = f"services:\n  app:\n    image: {TEST_IMAGE}\n    command: ['sleep', '3600']\n    stop_grace_period: 1s\n"
    first, second = await renter.stack(rental_id, content, name="a"), await renter.stack(rental_id, content, name="b")
    for stack_id in (first, second):
        assert (await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR)))["status"] == wire.APPLIED
    assert len(await asyncio.to_thread(env_containers, docker_client, renter.store.envId)) == 2

    status, rental = await renter.call("DELETE", f"/rentals/{rental_id}")
    assert status == 200 and rental["status"] == wire.RENTAL_COMPLETE
    for stack_id in (first, second):
        await renter.wait_stack(rental_id, stack_id, (), timeout=30)
    assert await asyncio.to_thread(env_containers, docker_client, renter.store.envId) == []
    status, body = await renter.call(
        "POST",
        f"/rentals/{rental_id}/stacks",
        {"template": {"name": "x", "description": "", "content": content, "environmentVariables": {}}},
    )
    assert status == 400 and "ended" in body["message"]


async def test_pull_from_local_registry(local_market, docker_client):
    """Missing images are pulled as part of the deploy (from the loopback registry)."""
    renter, _parts, _local = local_market
    image = "127.0.0.1:5000/gpuhost-test/busybox:1"
    if any(image in i.tags for i in await asyncio.to_thread(docker_client.images.list)):
        # untag only: the local test image keeps its own name
        await asyncio.to_thread(docker_client.images.remove, image)
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, f"services:\n  app:\n    image: {image}\n    command: ['sleep', '3600']\n")
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR))
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    assert await asyncio.to_thread(docker_client.images.get, image)


async def _eventually(fetch, done, timeout: float = 10):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await fetch()
        if done(value) or loop.time() > deadline:
            return value
        await asyncio.sleep(0.05)

"""The sandbox policy against the corpus in tests/sandbox_corpus/, end to end
through the local marketplace and the agent on the real engine: every hostile
file ends in ERROR with no container created, every legitimate file deploys.
(The decision alone: tests/unit/test_sandbox_corpus.py.)
"""

from __future__ import annotations

import asyncio

from support.sandbox_corpus import HOSTILE, LEGIT, assert_container_sandboxed, header
from support.stacks import TEST_IMAGE

from gpuhost_agent.protocol import wire

# What the hostile files that join a network or volume by name try to reach,
# made to exist for real here: naming something outside the stack is refused.
FOREIGN_VOLUMES = ("data", "otherproject_data")
FOREIGN_NETWORKS = ("outside", "otherproject_default")


async def test_every_hostile_file_is_refused_with_no_container_or_made_safe(gpu_agent, docker_client) -> None:
    # All hostile files in one rental: more stacks than a rental may have, by design here.
    renter, _parts, local, _ = await gpu_agent(gpus=2, stacks_per_rental=len(HOSTILE))
    local.state.stacks_per_rental = len(HOSTILE)
    rental = await renter.rental(gpu_count=2)
    made = [await asyncio.to_thread(docker_client.volumes.create, name) for name in FOREIGN_VOLUMES]
    made += [await asyncio.to_thread(docker_client.networks.create, name) for name in FOREIGN_NETWORKS]
    try:
        stacks = {
            path: await renter.stack(rental, await asyncio.to_thread(path.read_text), name=path.stem)
            for path in HOSTILE
        }
        results = await renter.wait_stacks(rental, list(stacks.values()), (wire.APPLIED, wire.ERROR), timeout=120)
        for (path, stack_id), stack in zip(stacks.items(), results, strict=True):
            outcome = header(path).get("outcome", "refused")
            if outcome == "refused":
                assert stack["status"] == wire.ERROR and header(path)["expect"] in stack["errorMsg"], (path.name, stack)
                created = await asyncio.to_thread(
                    docker_client.containers.list, all=True, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}
                )
                assert created == [], path.name
                continue
            assert stack["status"] == wire.APPLIED, (path.name, stack["errorMsg"])
            if outcome == "rewritten":
                assert header(path)["expect"] in stack["errorMsg"], (path.name, stack["errorMsg"])
            for container in await asyncio.to_thread(
                docker_client.containers.list, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}
            ):
                assert_container_sandboxed(container.attrs, allowed_gpus=2)
    finally:
        status, _ = await renter.call("DELETE", f"/rentals/{rental}")
        assert status == 200
        for thing in made:
            await asyncio.to_thread(_remove_quietly, thing)


def _remove_quietly(thing) -> None:
    try:
        thing.remove()
    except Exception:  # noqa: BLE001 - still in use by a container being removed: the cleanup target takes it
        pass


async def test_every_legitimate_file_deploys(gpu_agent, docker_client) -> None:
    renter, _parts, _local, _ = await gpu_agent(gpus=4)
    for path in LEGIT:
        rental = await renter.rental(gpu_count=int(header(path).get("gpus", 0)))
        stack_id = await renter.stack(rental, await asyncio.to_thread(path.read_text), name=path.stem)
        stack = await renter.wait_stack(rental, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
        assert stack["status"] == wire.APPLIED, (path.name, stack["errorMsg"])
        for container in await asyncio.to_thread(
            docker_client.containers.list, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}
        ):
            assert_container_sandboxed(container.attrs, allowed_gpus=int(header(path).get("gpus", 0)))
        assert TEST_IMAGE.split(":")[0] in await asyncio.to_thread(path.read_text)
        status, _ = await renter.call("DELETE", f"/rentals/{rental}")
        assert status == 200


# As published files write it (n8n's starter kit, Open WebUI): a fixed container_name that the
# other services use as a host name. Each server answers with its own stack's MARK.
NAMED_CONTAINERS = f"""
services:
  server:
    image: {TEST_IMAGE}
    container_name: model-server
    environment:
      MARK: ${{MARK}}
    command: ["sh", "-c", "mkdir -p /www && echo $$MARK > /www/index.html && exec httpd -f -p 8080 -h /www"]
  client:
    image: {TEST_IMAGE}
    container_name: model-client
    command: ["sh", "-c", "until wget -qO- http://model-server:8080/; do sleep 0.2; done; exec sleep 3600"]
"""


async def test_two_rentals_deploy_the_same_container_names(local_market, docker_client) -> None:
    """container_name is one namespace for the whole host: each rental's stack
    deploys, and its services reach their own `model-server` by that name."""
    renter, _parts, _local = local_market
    stacks = []
    for mark in ("first-rental", "second-rental"):
        rental = await renter.rental()
        stack_id = await renter.stack(rental, NAMED_CONTAINERS, {"MARK": mark})
        stack = await renter.wait_stack(rental, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
        assert stack["status"] == wire.APPLIED, stack["errorMsg"]
        assert "container_name 'model-server' dropped" in stack["errorMsg"]
        stacks.append((mark, stack_id))
    for mark, stack_id in stacks:
        (client,) = await asyncio.to_thread(
            docker_client.containers.list,
            filters={"label": [f"{wire.LABEL_STACK}={stack_id}", "com.docker.compose.service=client"]},
        )
        for _ in range(50):
            printed = (await asyncio.to_thread(client.logs, stdout=True, stderr=False)).decode()  # not wget's retries
            if printed:
                break
            await asyncio.sleep(0.1)
        assert printed.strip() == mark  # its own stack's server, not the other rental's

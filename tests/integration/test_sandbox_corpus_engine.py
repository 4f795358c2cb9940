"""The sandbox policy against the corpus in tests/sandbox_corpus/, end to end
through the local marketplace and the agent on the real engine: every hostile
file ends in ERROR with no container created, every legitimate file deploys.
(The decision alone: tests/unit/test_sandbox_corpus.py.)
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

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


# What published GPU files ask of the host, all in one service.
HOST_ASKS = f"""
services:
  server:
    image: {TEST_IMAGE}
    network_mode: host
    ports: ["8787:8080"]
    env_file: ../../.env
    environment:
      HF_TOKEN: ${{HF_TOKEN}}
    volumes:
      - ${{MODEL_DIRECTORY}}:/opt/nim/.cache
    deploy: {{resources: {{reservations: {{memory: 64g}}}}}}
    command:
      - sh
      - -c
      - mkdir -p /www && touch /opt/nim/.cache/mine && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www
"""


async def test_published_host_asks_run_on_the_stack_own_terms(local_market, docker_client) -> None:
    """The stack runs, each change is said in errorMsg, and `docker inspect`
    shows the sandbox held: no host path mounted (nor created), not the
    host's network, a reservation within the limit, the host port the
    engine's; curl reaches the server on the port the container list shows.
    On the agent before: refused (host network, absolute bind, env_file
    above the file), and once those were gone the engine refused the
    reservation; the host port and the unset HF_TOKEN were silent."""
    renter, _parts, _local = local_market
    host_dir = Path(f"/srv/gpuhost-models-{uuid.uuid4().hex[:8]}")  # a data directory the host would have
    rental = await renter.rental()
    stack_id = await renter.stack(rental, HOST_ASKS, {"MODEL_DIRECTORY": str(host_dir)})
    stack = await renter.wait_stack(rental, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    said = stack["errorMsg"]
    for notice in (
        "env_file '../../.env' dropped",
        "network_mode host became the stack's own network",
        "port(s) 8080 are reached",
        "host port 8787 dropped; container port 8080 is published on a free host port",
        f"volumes {host_dir} became the stack's named volume 'host_",
        "deploy.resources.reservations.memory 64.0 GiB lowered",
        'deployed with Compose\'s warnings: The "HF_TOKEN" variable is not set',
    ):
        assert notice in said, (notice, said)
    (container,) = await asyncio.to_thread(
        docker_client.containers.list, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}
    )
    assert_container_sandboxed(container.attrs, allowed_gpus=0)
    host = container.attrs["HostConfig"]
    assert host["NetworkMode"] not in ("host", "default", "bridge"), host["NetworkMode"]
    assert all(mount["Type"] == "volume" for mount in container.attrs["Mounts"]), container.attrs["Mounts"]
    assert not await asyncio.to_thread(host_dir.exists)  # never mounted, never created
    assert 0 < host["MemoryReservation"] <= host["Memory"]
    _, listed = await renter.call("GET", f"/rentals/{rental}/stacks/{stack_id}/containers")
    (port,) = [p for c in listed for p in c.get("Ports") or [] if p.get("PublicPort")]
    assert port["PrivatePort"] == 8080
    for _ in range(50):
        curl = await asyncio.create_subprocess_exec(
            "curl", "-s", "--max-time", "2", f"http://127.0.0.1:{port['PublicPort']}/", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await curl.communicate()
        if out.strip() == b"ok":
            break
        await asyncio.sleep(0.1)
    assert out.strip() == b"ok"
    status, _ = await renter.call("DELETE", f"/rentals/{rental}")
    assert status == 200

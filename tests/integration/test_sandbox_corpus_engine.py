"""The sandbox policy against the corpus in tests/sandbox_corpus/, end to end
through the local marketplace and the agent on the real engine: every hostile
file ends in ERROR with no container created, every legitimate file deploys.
(The decision alone: tests/unit/test_sandbox_corpus.py.)
"""

from __future__ import annotations

import asyncio

from support.sandbox_corpus import HOSTILE, LEGIT, header
from support.stacks import TEST_IMAGE

from gpuhost_agent.protocol import wire


async def test_every_hostile_file_ends_in_error_with_no_container(gpu_agent, docker_client) -> None:
    renter, _parts, _local, _ = await gpu_agent(gpus=2)
    rental = await renter.rental(gpu_count=2)
    stacks = {
        path: await renter.stack(rental, await asyncio.to_thread(path.read_text), name=path.stem) for path in HOSTILE
    }
    results = await asyncio.gather(
        *(renter.wait_stack(rental, stack_id, (wire.APPLIED, wire.ERROR), timeout=120) for stack_id in stacks.values())
    )
    for (path, _stack_id), stack in zip(stacks.items(), results, strict=True):
        assert stack["status"] == wire.ERROR and stack["errorMsg"], path.name
        assert header(path)["expect"] in stack["errorMsg"], (path.name, stack["errorMsg"])
    created = await asyncio.to_thread(
        docker_client.containers.list, all=True, filters={"label": f"{wire.LABEL_RENTAL}={rental}"}
    )
    assert created == []


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
            host_config = container.attrs["HostConfig"]
            assert host_config["Privileged"] is False and "no-new-privileges:true" in host_config["SecurityOpt"]
            assert host_config["Memory"] > 0 and host_config["NanoCpus"] > 0 and host_config["PidsLimit"] > 0
            assert {"MKNOD", "NET_RAW", "SYS_ADMIN"} <= {cap.removeprefix("CAP_") for cap in host_config["CapDrop"]}
            assert not host_config.get("CapAdd")
            for bindings in (host_config.get("PortBindings") or {}).values():
                assert all(binding["HostIp"] == "127.0.0.1" for binding in bindings)
        assert TEST_IMAGE.split(":")[0] in await asyncio.to_thread(path.read_text)
        status, _ = await renter.call("DELETE", f"/rentals/{rental}")
        assert status == 200

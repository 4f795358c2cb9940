"""A Swarm environment's leader, end to end: `gpuhost-agent run` with
GPUHOST_SWARM=leader on the manager of a real two-node Swarm
(scripts/swarm-cluster.sh), a local marketplace, and a renter over HTTP.

The environment lists every machine's GPUs; two rentals of two GPUs each get
one machine's GPUs each (a container runs on one machine), so their stacks
run across both machines, each GPU container on the machine of its GPUs and
with exactly those; the renter's container list shows them wherever they
run, and the logs of one on the other machine come through the manager (a
terminal or an SSH session there is refused, saying why, with no worker agent
there); removing a stack and ending a rental
leave nothing on either machine.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from support.renter_streams import STDERR, STDOUT, create_terminal, logs_path, read_logs
from support.ssh_clients import Endpoint, registered_key
from support.swarm import GPU_STACK, cluster_gpus, docker, labelled, leader_ready
from support.waiting import until

from gpuhost_agent.local_marketplace import shapes
from gpuhost_agent.protocol import wire

pytestmark = pytest.mark.swarm


async def logs_and_no_terminal_on_the_other_machine(renter, rental_id: str, stack_id: str, container: str) -> None:
    key = renter.store.renterApiKey
    path = logs_path(rental_id, stack_id, container)
    status, demux, _ = await read_logs(renter.http, renter.base_url, key, path)
    assert status == 200 and demux.lines(STDOUT) == ["train-started"] and demux.lines(STDERR) == ["to-stderr"]
    status, body = await create_terminal(renter.http, renter.base_url, key, rental_id, stack_id, container)
    assert status in (200, 201), body
    async with renter.http.ws_connect(body["url"]) as ws:
        message = await asyncio.wait_for(ws.receive(), 30)
    end = json.loads(message.data)
    assert end["type"] == "end" and end["status"] == 409 and "another machine" in end["error"], end


async def no_ssh_on_the_other_machine(renter, rental_id: str, stack_id: str, key, tmp_path) -> None:
    def is_train(tunnel: dict) -> bool:
        return tunnel["protocol"] == "ssh" and tunnel["service"] == "train" and bool(tunnel["ssh"]["hostKey"])

    (tunnel,) = await renter.tunnels(rental_id, stack_id, 1, is_train, timeout=30)
    info = tunnel["ssh"]
    end = await asyncio.to_thread(Endpoint, info["host"], info["port"], info["hostKey"], tmp_path)
    done = await asyncio.to_thread(end.ssh, key, info["user"], "true")
    assert done.returncode == 255 and b"another machine" in done.stderr and b"did not answer" in done.stderr, done


async def both_listed(renter, rental_id: str, stack_id: str) -> bool:
    return len(await renter.containers(rental_id, stack_id)) == 2


async def nothing_left(machine: int, env_id: str) -> bool:
    left = await asyncio.to_thread(docker, machine, "ps", "-aq", "--filter", f"label={wire.LABEL_ENV}={env_id}")
    return not left.strip()


async def test_two_rentals_run_across_both_machines_and_go_from_both(swarm_leader, tmp_path) -> None:
    (renter, market, agent), machines = swarm_leader
    await leader_ready(agent, market)
    key = await registered_key(renter, tmp_path / "renter")
    rentals = [await renter.rental(gpu_count=2), await renter.rental(gpu_count=2)]
    stacks = [await renter.stack(rental_id, GPU_STACK, isSSHEnabled=True) for rental_id in rentals]
    for rental_id, stack_id in zip(rentals, stacks, strict=True):
        done = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=120)
        assert done and done["status"] == wire.APPLIED, (done, agent.logs()[-3000:])

    gpu_machines = []
    for rental_id, stack_id in zip(rentals, stacks, strict=True):
        await until(
            lambda r=rental_id, s=stack_id: both_listed(renter, r, s), timeout=30
        )  # after APPLIED, by the outbox
        listed = {labelled(c)["com.docker.compose.service"]: c for c in await renter.containers(rental_id, stack_id)}
        assert set(listed) == {"train", "web"} and {c["State"] for c in listed.values()} == {"running"}
        train = listed["train"]
        machine = machines[labelled(train)["com.docker.swarm.node.id"]]
        (info,) = json.loads(await asyncio.to_thread(docker, machine, "inspect", train["Id"]))
        visible = next(e for e in info["Config"]["Env"] if e.startswith("NVIDIA_VISIBLE_DEVICES="))
        assert set(visible.split("=", 1)[1].split(",")) == cluster_gpus(machine)  # its machine's, both
        assert info["HostConfig"]["Memory"] > 0 and info["HostConfig"]["PidsLimit"] > 0
        gpu_machines.append(machine)
        if machine == 2:
            await logs_and_no_terminal_on_the_other_machine(renter, rental_id, stack_id, train["Id"])
            await no_ssh_on_the_other_machine(renter, rental_id, stack_id, key, tmp_path)
    assert sorted(gpu_machines) == [1, 2]  # one machine's GPUs each: the stacks span both machines
    assert shapes.listing(market.store)["availableGPUs"] == 0

    status, _ = await renter.call("DELETE", f"/rentals/{rentals[0]}/stacks/{stacks[0]}")
    assert status in (200, 202, 204)
    await renter.wait_stack(rentals[0], stacks[0], (), timeout=90)
    status, _ = await renter.call("DELETE", f"/rentals/{rentals[1]}")
    assert status in (200, 202, 204)
    for machine in (1, 2):
        await until(lambda machine=machine: nothing_left(machine, market.store.envId), timeout=90)
    assert not (await asyncio.to_thread(docker, 1, "service", "ls", "-q")).strip()

"""The agent on the other machine of a Swarm environment (GPUHOST_SWARM=worker),
end to end: the leader agent process on the manager, a worker agent process
on machine 2's engine, the local marketplace and a renter over HTTP. A
terminal opened through the marketplace in a container on machine 2 runs
there (its hostname is that container's), both ways, through the worker's
door and the environment's key, again after the worker was killed with
SIGKILL and started again (it keeps nothing to lose); the worker's log
holds none of the key. The environment's systemData holds machine 2's own
report, made by its agent, and its compliance counts; the heartbeats carry
its GPUs' live figures. A tunnel reaches a
service on either machine, on a port of its `ports:` and one of its
`expose:`, which `docker stack deploy` drops."""

from __future__ import annotations

import asyncio
import signal
import subprocess

import pytest
from conftest import SWARM_KEY
from support.renter_streams import create_terminal, terminal_until
from support.stacks import TEST_IMAGE
from support.swarm import GPU_STACK, applied_trains, cluster_gpus, labelled, leader_ready
from support.waiting import until

from gpuhost_agent.local_marketplace import shapes

pytestmark = pytest.mark.swarm


async def test_a_terminal_in_a_container_on_the_other_machine_runs_there_through_its_agent(
    swarm_leader, swarm_worker
) -> None:
    (renter, market, agent), machines = swarm_leader
    worker = swarm_worker
    await leader_ready(agent, market)
    await until(lambda: machine_report(market.store, machines, 2), timeout=60)
    two = machine_report(market.store, machines, 2)
    assert {gpu["uuid"] for gpu in two["nvml"]["gpus"]} == cluster_gpus(2)  # its own NVML's, not the leader's
    node_two = next(node for node, machine in machines.items() if machine == 2)
    assert two["host"]["docker"]["swarm"]["nodeId"] == node_two
    report = market.store.host["report"]  # listed as both machines together
    cpus = [data["host"]["cpu"]["logicalCores"] for data in (report["systemData"], two)]
    assert report["listing"]["totalCPUs"] == sum(cpus) and shapes.listing(market.store)["totalCPUs"] == sum(cpus)
    await until(lambda: beat_gpus(market, node_two), timeout=60)  # and its live figures in the heartbeats
    assert {gpu["uuid"] for gpu in beat_gpus(market, node_two)} == cluster_gpus(2)
    checks = market.store.host["report"]["compliance"]["checks"]
    (machine_check,) = [check for check in checks if check["id"] == "swarm-machines"]
    own_failures = [check["id"] for check in checks if not check["ok"] and check["id"] != "swarm-machines"]
    # Both machines are this test host: machine 2, judged by the leader, fails what the leader fails.
    verdict = f"({', '.join(own_failures)})" if own_failures else "are compliant"
    assert not machine_check["skipped"] and verdict in machine_check["summary"], (machine_check, own_failures)
    rentals = [await renter.rental(gpu_count=2), await renter.rental(gpu_count=2)]
    stacks = {rental_id: await renter.stack(rental_id, GPU_STACK) for rental_id in rentals}
    on_two = None
    for rental_id, (stack_id, train) in (await applied_trains(renter, stacks)).items():
        if machines[labelled(train)["com.docker.swarm.node.id"]] == 2:
            on_two = (rental_id, stack_id, train)
    assert on_two is not None
    rental_id, stack_id, train = on_two

    key = renter.store.renterApiKey
    for run in ("first", "after the worker was killed and started again"):
        status, body = await create_terminal(
            renter.http, renter.base_url, key, rental_id, stack_id, train["Id"], cols=80, rows=24
        )
        assert status == 201, (run, body)
        async with renter.http.ws_connect(body["url"]) as ws:
            await ws.send_bytes(b"echo host-$(hostname) sum-$((6*7))\n")
            seen = await terminal_until(ws, "sum-42", timeout=20)
        assert f"host-{train['Id'][:12]}" in seen, run  # the container on machine 2, not one on the leader's
        await worker.stop(signal.SIGKILL)  # a worker keeps nothing: restarted, it serves as before
        await worker.start()
    text = await asyncio.to_thread(worker.log_path.read_text)
    assert text.count("swarm_worker_started") == 3 and SWARM_KEY not in text


def beat_gpus(market, node: str) -> list[dict] | None:
    """The GPUs of machine `node` in the leader's last heartbeat, if there."""
    body = (market.state.heartbeat or {}).get("body") or {}
    return ((body.get("machines") or {}).get(node) or {}).get("gpus")


def machine_report(store, machines: dict, number: int) -> dict | None:
    """Machine `number`'s own systemData in the environment's last report, if there."""
    nodes = ((store.host.get("report") or {}).get("systemData") or {}).get("environment", {}).get("nodes", [])
    for node in nodes:
        if machines.get(node["nodeId"]) == number:
            return (node.get("machine") or {}).get("systemData")
    return None


WEB_ON_GPUS = f"""
services:
  train:
    image: {TEST_IMAGE}
    command:
      - sh
      - -c
      - >-
        mkdir /www && echo served-by-$$(hostname) > /www/i &&
        httpd -p 8000 -h /www && exec httpd -f -p 8080 -h /www
    ports: ["8080"]
    expose: ["8000"]
    deploy:
      resources:
        reservations:
          devices: [{{driver: nvidia, count: all, capabilities: [gpu]}}]
"""


def curl(url: str) -> str:
    done = subprocess.run(["curl", "-sS", "--max-time", "10", url], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def test_a_tunnel_reaches_a_service_on_either_machine_over_its_overlay(swarm_leader, swarm_worker) -> None:
    """The stack's networks are overlays, out of the hosts' reach: on the
    leader's machine the leader dials from inside the container's network
    namespace, on machine 2 the worker does and its door relays the bytes."""
    (renter, market, agent), machines = swarm_leader
    await leader_ready(agent, market)
    rentals = [await renter.rental(gpu_count=2), await renter.rental(gpu_count=2)]
    stacks = {rental_id: await renter.stack(rental_id, WEB_ON_GPUS) for rental_id in rentals}
    served_from = []
    for rental_id, (stack_id, train) in (await applied_trains(renter, stacks)).items():
        tunnels = {t["containerPort"]: t for t in await renter.tunnels(rental_id, stack_id, 2, timeout=30)}
        assert sorted(tunnels) == [8000, 8080]  # `ports:` and `expose:` (Swarm drops expose: the agent's label)
        for tunnel in tunnels.values():
            assert await asyncio.to_thread(curl, tunnel["url"] + "i") == f"served-by-{train['Id'][:12]}"
        served_from.append(machines[labelled(train)["com.docker.swarm.node.id"]])
    assert sorted(served_from) == [1, 2]
    # A normal stop, with the leader's event stream open through the door: no traceback in the worker's log.
    await swarm_worker.stop()
    text = await asyncio.to_thread(swarm_worker.log_path.read_text)
    assert "swarm_worker_stopped" in text and "Traceback" not in text and "CancelledError" not in text, text

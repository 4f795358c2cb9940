"""The test Swarm's own costs: how long scripts/swarm-cluster.sh takes to bring N engines up as
a Swarm and to take them down, and how long `docker stack deploy` takes from
the command to every task running, for a published-style file as it stands
and for the same file after the agent's sandbox and Swarm rewrite
(core/swarm/stack_file.py: limits, placement by node id, dnsrr, restart policy).
The ratio is what the rewrite costs Swarm. Then the comparison that matters: the
agent as the environment's leader (GPUHOST_SWARM=leader, a separate process
on the manager, as in production), a stack created through the local
marketplace's renter API until the marketplace hears APPLIED, against
`docker stack deploy` of the same file alone until every task runs. The
agent's settle watch runs after APPLIED, as on one machine.

    .venv/bin/python bench/swarm_cluster.py [--nodes 2] [--rounds 2] [--deploys 3]

Needs root (network namespaces, dockerd) and the test image
(scripts/build-test-images.sh); leaves nothing behind (checked at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import aiohttp  # noqa: E402
from agent_runner import SeparateAgent  # noqa: E402
from pickup_latency import local_config, measure_stack, wait_until  # noqa: E402
from support.fake_nvml import build_lib  # noqa: E402
from support.swarm import PREFIX, cluster, deploy, docker, leftovers, node_id  # noqa: E402

from gpuhost_agent.core.sandbox.context import GIB, SandboxContext  # noqa: E402
from gpuhost_agent.core.sandbox.harden import harden  # noqa: E402
from gpuhost_agent.core.swarm_rewrite import SwarmPlacement, swarm_stack  # noqa: E402
from gpuhost_agent.protocol import wire  # noqa: E402
from gpuhost_agent.service.config import default_of
from gpuhost_agent.service.wiring import start_local_marketplace  # noqa: E402

BOX = {"image": "gpuhost-test/busybox:1", "command": ["sh", "-c", "trap exit TERM; sleep 3600 & wait"]}
PUBLISHED = {"services": {"web": BOX, "worker": BOX}}  # two services, the shape of most templates
CTX = SandboxContext(
    project="bench",
    cpus=1.0,
    memory_bytes=GIB // 2,
    pids_limit=512,
    publish_address="0.0.0.0",
    log_max_size=default_of("log_max_size"),
    log_max_files=default_of("log_max_files"),
)


def rewritten(home: str, other: str) -> dict:
    """What the agent would deploy: hardened, then written for Swarm; the
    second service placed on the second machine, as a rental's GPU service."""
    hardened = harden(json.loads(json.dumps(PUBLISHED)), CTX)
    stack, _ = swarm_stack(hardened, CTX, SwarmPlacement(gpu_nodes={}, home_node=home))
    stack["services"]["worker"]["deploy"]["placement"]["constraints"] = [f"node.id == {other}"]
    return stack


def plain() -> dict:
    """The file as published, with only what this cluster needs (no IPVS: dnsrr)."""
    stack = json.loads(json.dumps(PUBLISHED))
    for service in stack["services"].values():
        service["deploy"] = {"endpoint_mode": "dnsrr"}
    return stack


def deploy_until_running(name: str, stack: dict) -> float:
    """Seconds from `docker stack deploy` to every task running; then removed and waited gone."""
    started = time.perf_counter()
    deploy(name, json.dumps(stack))
    while True:
        states = docker(1, "stack", "ps", "--format", "{{.CurrentState}}", name, check=False).split("\n")
        states = [state for state in states if state.strip()]
        if states and all(state.startswith("Running") for state in states):
            break
        time.sleep(0.05)
    took = time.perf_counter() - started
    docker(1, "stack", "rm", name)
    deadline = time.monotonic() + 60
    while docker(1, "network", "ls", "-q", "--filter", f"name={name}_", check=False).strip():
        if time.monotonic() > deadline:
            raise SystemExit(f"stack {name}'s network was not removed in 60 s")
        time.sleep(0.2)
    return took


async def leader_round(deploys: int, workdir: Path) -> list[float]:
    """Seconds from the renter's create to APPLIED at the marketplace, for the
    published file, through a leader agent on the cluster's manager."""
    config = local_config(workdir, settle_seconds=3.0, stop_timeout=10)
    local = await start_local_marketplace(config)
    store = local.state.store
    os.environ["DOCKER_HOST"] = f"unix:///run/{PREFIX}/n1/docker.sock"
    os.environ["FAKE_NVML_CONFIG"] = f"/run/{PREFIX}/n1/nvml.conf"
    settings = {
        "GPUHOST_SWARM": "leader",
        "GPUHOST_NVML_LIBRARY": str(await asyncio.to_thread(build_lib)),
        "GPUHOST_GPU_CHECK_IMAGE": BOX["image"],
        "GPUHOST_DISK_FLOOR": "0",
    }
    agent = SeparateAgent(config, local, workdir, settings)
    took = []
    try:
        await agent.start()
        await wait_until(lambda: local.state.polls_started > 0, 60, "the leader's first job poll")
        async with aiohttp.ClientSession(
            local.base_url + "/", headers={wire.API_KEY_HEADER: store.renterApiKey}
        ) as http:
            async with http.post("rentals", json={"envId": store.envId, "name": "bench", "gpuCount": 0}) as resp:
                resp.raise_for_status()
                rental_id = (await resp.json())["rentalId"]
            for n in range(deploys):
                template = {
                    "name": f"leader{n}",
                    "description": "swarm bench",
                    "content": json.dumps(PUBLISHED),
                    "environmentVariables": {},
                }
                async with http.post(f"rentals/{rental_id}/stacks", json={"template": template}) as resp:
                    resp.raise_for_status()
                    stack_id = await resp.json()
                await wait_until(
                    lambda stack_id=stack_id: store.stacks[stack_id]["status"] in (wire.APPLIED, wire.ERROR),
                    180,
                    "APPLIED",
                )
                if store.stacks[stack_id]["status"] == wire.ERROR:
                    raise RuntimeError(f"the leader's deploy failed: {store.stacks[stack_id]['errorMsg']}")
                took.append(measure_stack(store, stack_id)["create_to_applied_ms"] / 1000)
                async with http.delete(f"rentals/{rental_id}/stacks/{stack_id}") as resp:
                    resp.raise_for_status()
                await wait_until(lambda stack_id=stack_id: stack_id not in store.stacks, 180, "the stack's removal")
    finally:
        await agent.stop()
        await local.stop()
        os.environ.pop("DOCKER_HOST", None)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="cluster up/down cycles")
    parser.add_argument("--deploys", type=int, default=3, help="deploys of each file per round")
    args = parser.parse_args()
    if leftovers():
        raise SystemExit(f"a test cluster is still up: bash scripts/swarm-cluster.sh down ({leftovers()[:3]})")
    ups, downs, raw, agent, leader = [], [], [], [], []
    for round_ in range(args.rounds):
        started = time.perf_counter()
        try:
            cluster("up", str(args.nodes), timeout=300)
            ups.append(time.perf_counter() - started)
            home, other = node_id(1), node_id(2)
            for n in range(args.deploys):
                raw.append(deploy_until_running(f"plain{round_}x{n}", plain()))
                agent.append(deploy_until_running(f"rental{round_}x{n}", rewritten(home, other)))
            with tempfile.TemporaryDirectory(prefix="swarm-bench-") as workdir:
                leader.extend(asyncio.run(leader_round(args.deploys, Path(workdir))))
        finally:
            started = time.perf_counter()
            cluster("down", timeout=300)
            downs.append(time.perf_counter() - started)
        print(f"round {round_ + 1}: up {ups[-1]:.1f} s, down {downs[-1]:.1f} s", flush=True)
    left = leftovers()
    print()
    print(f"Swarm test cluster, {args.nodes} nodes, {args.rounds} rounds, {args.deploys} deploys of each file a round")
    print(f"{'measure':<46} {'median':>8} {'min':>8} {'max':>8}")
    for label, values in (
        (f"cluster up ({args.nodes} engines, Swarm formed)", ups),
        ("cluster down (nothing left)", downs),
        ("stack deploy -> all running, file as published", raw),
        ("stack deploy -> all running, agent's rewrite", agent),
        ("agent (leader): create -> APPLIED", leader),
    ):
        print(f"{label:<46} {statistics.median(values):>7.2f}s {min(values):>7.2f}s {max(values):>7.2f}s")
    ratio = statistics.median(agent) / statistics.median(raw)
    print(f"{'ratio rewrite / as published (medians)':<46} {ratio:>8.2f}")
    print(
        f"{'ratio agent / stack deploy alone (medians)':<46} {statistics.median(leader) / statistics.median(raw):>8.2f}"
    )
    print(f"left behind after down: {left or 'nothing'}")
    if left:
        raise SystemExit(1)


if __name__ == "__main__":
    try:
        main()
    except subprocess.TimeoutExpired as exc:
        raise SystemExit(f"timed out: {exc}") from None

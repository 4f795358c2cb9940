"""The test Swarm's own costs (issue "One environment, many machines",
benchmark): how long scripts/swarm-cluster.sh takes to bring N engines up as
a Swarm and to take them down, and how long `docker stack deploy` takes from
the command to every task running, for a published-style file as it stands
and for the same file after the agent's sandbox and Swarm rewrite
(core/swarm_rewrite.py: limits, placement by node id, dnsrr, restart policy).
The ratio is what the rewrite costs Swarm; the agent's own create -> APPLIED
through the marketplace joins this table once the agent deploys to a Swarm.

    .venv/bin/python bench/swarm_cluster.py [--nodes 2] [--rounds 2] [--deploys 3]

Needs root (network namespaces, dockerd) and the test image
(scripts/build-test-images.sh); leaves nothing behind (checked at the end).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.swarm import cluster, deploy, docker, leftovers, node_id  # noqa: E402

from gpuhost_agent.core.sandbox_context import GIB, SandboxContext  # noqa: E402
from gpuhost_agent.core.sandbox_harden import harden  # noqa: E402
from gpuhost_agent.core.swarm_rewrite import SwarmPlacement, swarm_stack  # noqa: E402

BOX = {"image": "gpuhost-test/busybox:1", "command": ["sh", "-c", "trap exit TERM; sleep 3600 & wait"]}
PUBLISHED = {"services": {"web": BOX, "worker": BOX}}  # two services, the shape of most templates
CTX = SandboxContext(project="bench", cpus=1.0, memory_bytes=GIB // 2, pids_limit=512)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="cluster up/down cycles")
    parser.add_argument("--deploys", type=int, default=3, help="deploys of each file per round")
    args = parser.parse_args()
    if leftovers():
        raise SystemExit(f"a test cluster is still up: bash scripts/swarm-cluster.sh down ({leftovers()[:3]})")
    ups, downs, raw, agent = [], [], [], []
    for round_ in range(args.rounds):
        started = time.perf_counter()
        try:
            cluster("up", str(args.nodes), timeout=300)
            ups.append(time.perf_counter() - started)
            home, other = node_id(1), node_id(2)
            for n in range(args.deploys):
                raw.append(deploy_until_running(f"plain{round_}x{n}", plain()))
                agent.append(deploy_until_running(f"rental{round_}x{n}", rewritten(home, other)))
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
    ):
        print(f"{label:<46} {statistics.median(values):>7.2f}s {min(values):>7.2f}s {max(values):>7.2f}s")
    ratio = statistics.median(agent) / statistics.median(raw)
    print(f"{'ratio rewrite / as published (medians)':<46} {ratio:>8.2f}")
    print(f"left behind after down: {left or 'nothing'}")
    if left:
        raise SystemExit(1)


if __name__ == "__main__":
    try:
        main()
    except subprocess.TimeoutExpired as exc:
        raise SystemExit(f"timed out: {exc}") from None

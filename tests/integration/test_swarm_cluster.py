"""The test cluster (scripts/swarm-cluster.sh): two real Docker Engines, each in
a network namespace of its own, form a Swarm; a stack's services on two
machines talk over the stack's overlay, another stack's cannot reach them; and
`down` leaves no namespace, process, mount or file behind.

Marked `swarm` as well as `docker`: `-m swarm` runs the cluster tests alone.
Checks go through each node's own engine (`docker -H`), never ours.
"""

from __future__ import annotations

import fcntl
import json
import re
import time
from pathlib import Path

import pytest
from support.swarm import LOCK, PREFIX, cluster, container_of, deploy, docker, leftovers, node_id, swarm

pytestmark = pytest.mark.swarm

# `nc`, not wget: the test image's static busybox crashes resolving names
# through glibc, so the client asks Swarm's DNS with nslookup, then connects.
FIND_WEB = "nslookup web 2>/dev/null | sed -n 's/^Address: *//p' | tail -n 1"
REACH = (
    "trap exit TERM; while true; do ip=$$(%s);"
    ' printf "GET /i HTTP/1.0\\r\\n\\r\\n" | nc -w 2 $$ip 8080 | tail -n 1; echo tried=$$ip; sleep 0.5; done & wait'
)
SERVED = "trap exit TERM; mkdir -p /www; echo hi-over-the-overlay > /www/i; httpd -f -p 8080 -h /www & wait"


def _service(script: str, node: str) -> dict:
    return {
        "image": "gpuhost-test/busybox:1",
        "command": ["sh", "-c", script],
        # No IPVS in this kernel: DNS round robin instead of a virtual IP.
        "deploy": {"endpoint_mode": "dnsrr", "placement": {"constraints": [f"node.labels.gpuhost.node == {node}"]}},
    }


def _stack(services: dict) -> str:
    return json.dumps({"services": services})  # JSON is YAML


def _client_says(stack: str, needle: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while needle not in (logs := docker(1, "service", "logs", "--raw", f"{stack}_client", check=False)):
        assert time.monotonic() < deadline, logs
        time.sleep(1)
    return logs


def test_a_stack_spans_two_machines_over_its_overlay_others_cannot_reach_it_down_leaves_nothing() -> None:
    with swarm(2):
        nodes = docker(1, "node", "ls", "--format", "{{.Status}} {{.ManagerStatus}}").splitlines()
        assert sorted(nodes) == ["Ready ", "Ready Leader"]
        # Each node's stand-in GPUs: the manager sees them as the node's NVIDIA-GPU resources,
        # an agent on the node through its own stand-in NVML configuration.
        for node in (1, 2):
            resources = json.loads(docker(1, "node", "inspect", node_id(node), "-f", "{{json .Description.Resources}}"))
            seen = sorted(r["NamedResourceSpec"]["Value"] for r in resources["GenericResources"])
            configured = re.findall(r"^gpu \d+ uuid (\S+)$", Path(f"/run/{PREFIX}/n{node}/nvml.conf").read_text(), re.M)
            assert len(seen) == 2 and sorted(configured) == seen, (seen, configured)
        assert not set(seen) & set(re.findall(r"uuid (\S+)", Path(f"/run/{PREFIX}/n1/nvml.conf").read_text()))

        deploy("one", _stack({"web": _service(SERVED, "n1"), "client": _service(REACH % FIND_WEB, "n2")}))
        _client_says("one", "hi-over-the-overlay")
        # Each service runs where it was placed: its container is on that node's own engine.
        assert "one_web" in docker(1, "ps", "--format", "{{.Names}}")
        assert "one_client" in docker(2, "ps", "--format", "{{.Names}}")

        # Another stack, on the web's own machine: the web's overlay address gets no answer.
        web_ip = docker(1, "exec", container_of(1, "one_web"), "hostname", "-i").split()[0]
        deploy("two", _stack({"client": _service(REACH % f"echo {web_ip}", "n1")}))
        assert "hi-over-the-overlay" not in _client_says("two", f"tried={web_ip}")


def test_a_cluster_a_killed_run_left_is_taken_down_and_one_a_live_run_holds_is_left_alone() -> None:
    # A run killed between its `up` and its `down` leaves a cluster and no holder of the lock.
    cluster("up", "1")
    try:
        with open(LOCK, "a") as held:  # another run, alive, holds it
            fcntl.flock(held, fcntl.LOCK_EX)
            with pytest.raises(AssertionError, match="another test run holds the test Swarm"), swarm(1):
                pass
            assert leftovers(), "the live run's cluster was touched"
        with swarm(1):
            assert docker(1, "node", "ls", "--format", "{{.Status}}").split() == ["Ready"]
        assert leftovers() == []
    finally:
        if leftovers():
            cluster("down")

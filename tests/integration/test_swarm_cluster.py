"""The test cluster (scripts/swarm-cluster.sh): two real Docker Engines, each in
a network namespace of its own, form a Swarm; a stack's services on two
machines talk over the stack's overlay, another stack's cannot reach them; and
`down` leaves no namespace, process, mount or file behind.

Marked `swarm` as well as `docker`: `-m swarm` runs the cluster tests alone.
Checks go through each node's own engine (`docker -H`), never ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "swarm-cluster.sh"
PREFIX = "gpuhost-swarm"

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


def _cluster(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _docker(node: int, *args: str, stdin: str | None = None, check: bool = True) -> str:
    env = {**os.environ, "DOCKER_HOST": f"unix:///run/{PREFIX}/n{node}/docker.sock"}
    done = subprocess.run(["docker", *args], input=stdin, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 or not check, done.stdout + done.stderr
    return done.stdout + done.stderr


def _deploy(name: str, content: str) -> None:
    """`docker stack deploy` on the manager; its first deploys may be refused for
    a few seconds ("node is missing network attachments")."""
    deadline = time.monotonic() + 60
    while "Creating service" not in (out := _docker(1, "stack", "deploy", "-c", "-", name, stdin=content, check=False)):
        assert time.monotonic() < deadline, out
        time.sleep(1)


def _client_says(stack: str, needle: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while needle not in (logs := _docker(1, "service", "logs", "--raw", f"{stack}_client", check=False)):
        assert time.monotonic() < deadline, logs
        time.sleep(1)
    return logs


def _leftovers() -> list[str]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    mounts = Path("/proc/mounts").read_text()
    engines = subprocess.run(["pgrep", "-f", f"dockerd .*{PREFIX}"], capture_output=True, text=True).stdout
    found = [line for line in namespaces.splitlines() if line.startswith(PREFIX)]
    found += [line for line in mounts.splitlines() if PREFIX in line]
    found += [f"dockerd pid {pid}" for pid in engines.split()]
    found += [str(path) for path in (Path("/run") / PREFIX, Path("/var/lib") / PREFIX) if path.exists()]
    return found


def test_a_stack_spans_two_machines_over_its_overlay_others_cannot_reach_it_down_leaves_nothing():
    assert _leftovers() == [], "a cluster from an earlier run is still up: scripts/swarm-cluster.sh down"
    try:
        _cluster("up", "2")
        nodes = _docker(1, "node", "ls", "--format", "{{.Status}} {{.ManagerStatus}}").splitlines()
        assert sorted(nodes) == ["Ready ", "Ready Leader"]

        _deploy("one", _stack({"web": _service(SERVED, "n1"), "client": _service(REACH % FIND_WEB, "n2")}))
        _client_says("one", "hi-over-the-overlay")
        # Each service runs where it was placed: its container is on that node's own engine.
        assert "one_web" in _docker(1, "ps", "--format", "{{.Names}}")
        assert "one_client" in _docker(2, "ps", "--format", "{{.Names}}")

        # Another stack, on the web's own machine: the web's overlay address gets no answer.
        web_ip = _docker(1, "exec", _container(1, "one_web"), "hostname", "-i").split()[0]
        _deploy("two", _stack({"client": _service(REACH % f"echo {web_ip}", "n1")}))
        assert "hi-over-the-overlay" not in _client_says("two", f"tried={web_ip}")
    finally:
        _cluster("down")
    assert _leftovers() == []


def _container(node: int, service: str) -> str:
    names = _docker(node, "ps", "--filter", f"name={service}", "--format", "{{.ID}}").split()
    assert names, f"no container of {service} on node {node}"
    return names[0]

"""A Swarm stack's container reaches only the internet, as
a one-machine stack's does: its overlays leave the machine through the
engine's docker_gwbridge, and the worker agent on that machine keeps the
same rules for traffic from it. On the test Swarm (scripts/swarm-cluster.sh),
in machine 2's own network namespace, with a worker agent started there:
from a task's container, a metadata stand-in on 169.254.169.254, the machine
itself (a service on all its addresses) and the other machine are refused;
an address standing for the internet is reached.

The stand-ins live in the cluster's bridge namespace (100.77.0.1, with
169.254.169.254 and 198.51.100.7, a documentation address, on its bridge),
routed from machine 2; nothing leaves this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.swarm import PREFIX, container_of, deploy, docker

from gpuhost_agent.runtime.egress_rules import SWARM_GATEWAY

pytestmark = pytest.mark.swarm

BRIDGE_NS, NODE_NS, OTHER_NS = (f"/run/netns/{PREFIX}-{name}" for name in ("br", "n2", "n1"))
GATEWAY, METADATA, INTERNET = "100.77.0.1", "169.254.169.254", "198.51.100.7"
NODE2, NODE1 = "100.77.0.12", "100.77.0.11"
PORT = 8099
STACK = {
    "services": {
        "probe": {
            "image": "gpuhost-test/busybox:1",
            "command": ["sh", "-c", "trap exit TERM; sleep 3600 & wait"],
            "networks": ["inside"],
            "deploy": {"placement": {"constraints": ["node.labels.gpuhost.node == n2"]}, "endpoint_mode": "dnsrr"},
        }
    },
    "networks": {"inside": {"driver": "overlay"}},
}


def _in(namespace: str, *command: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["nsenter", f"--net={namespace}", *command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 or not check, done.stdout + done.stderr
    return done


def _served(namespace: str, folder: Path) -> subprocess.Popen:
    """An HTTP server on every address of `namespace`, serving `folder`."""
    command = [sys.executable, "-m", "http.server", str(PORT), "--bind", "0.0.0.0", "--directory", str(folder)]
    return subprocess.Popen(
        ["nsenter", f"--net={namespace}", *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


@pytest.fixture
def stand_ins(shared_swarm, tmp_path) -> Iterator[None]:
    """The stand-ins, and machine 2's routes to them; all taken away after."""
    folder = tmp_path / "www"
    folder.mkdir()
    (folder / "i").write_text("reached\n")
    added = [("br", f"{GATEWAY}/24"), ("br", f"{METADATA}/32"), ("br", f"{INTERNET}/32")]
    for _, address in added:
        _in(BRIDGE_NS, "ip", "addr", "add", address, "dev", "br0")
    for target in (METADATA, INTERNET):
        _in(NODE_NS, "ip", "route", "add", target, "via", GATEWAY)
    servers = [_served(namespace, folder) for namespace in (BRIDGE_NS, NODE_NS, OTHER_NS)]
    try:
        yield
    finally:
        for server in servers:
            server.kill()
            server.wait()
        for target in (METADATA, INTERNET):
            _in(NODE_NS, "ip", "route", "del", target, check=False)
        for _, address in added:
            _in(BRIDGE_NS, "ip", "addr", "del", address, "dev", "br0", check=False)


@pytest.fixture
def worker_in_machine_2(shared_swarm, tmp_path, swarm_tls) -> Iterator[subprocess.Popen]:
    """The worker agent, started in machine 2's namespace as its unit would be there;
    stopped after, and its rules taken away (`gpuhost-agent egress remove`, as uninstall does)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUHOST_")}
    env |= {
        "DOCKER_HOST": f"unix:///run/{PREFIX}/n2/docker.sock",
        "GPUHOST_SWARM": "worker",
        "GPUHOST_SWARM_KEY": "test-environment-key-0123456789",
        "GPUHOST_SWARM_TLS_DIR": str(swarm_tls.worker),
        "GPUHOST_SWARM_LISTEN": f"{NODE2}:17946",
        "GPUHOST_STATE_DIR": str(tmp_path / "worker-state"),
        "GPUHOST_NVML_LIBRARY": "/nonexistent/libnvidia-ml.so.1",  # no GPU needed here
    }
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        ["nsenter", f"--net={NODE_NS}", sys.executable, "-m", "gpuhost_agent", "run"], env=env, stdout=log, stderr=log
    )
    try:
        yield worker
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()
        _in(NODE_NS, sys.executable, "-m", "gpuhost_agent", "egress", "remove", check=False)


def _reaches(container: str, address: str) -> bool:
    """`nc`, not wget: the test image's static busybox wget crashes on any address (it resolves it through glibc)."""
    ask = f'printf "GET /i HTTP/1.0\\r\\n\\r\\n" | nc -w 3 {address} {PORT}'
    return "reached" in docker(2, "exec", container, "sh", "-c", ask, check=False)


def test_a_swarm_tasks_container_reaches_the_internet_and_nothing_of_the_machines(
    stand_ins, worker_in_machine_2, tmp_path
) -> None:
    deploy("egress", json.dumps(STACK))
    container = container_of(2, "egress_probe")
    gateway = json.loads(docker(2, "network", "inspect", SWARM_GATEWAY))[0]["IPAM"]["Config"][0]["Gateway"]
    deadline = time.monotonic() + 60
    while f"-A DOCKER-USER -i {SWARM_GATEWAY} -j GPUHOST-EGRESS" not in _in(NODE_NS, "iptables", "-S").stdout:
        assert worker_in_machine_2.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
        assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
        time.sleep(0.5)
    assert _reaches(container, INTERNET)
    for refused in (METADATA, NODE2, gateway, NODE1):
        assert not _reaches(container, refused), refused
    # The proof that the rules did it: without them the metadata stand-in answers.
    worker_in_machine_2.terminate()
    worker_in_machine_2.wait(30)
    _in(NODE_NS, sys.executable, "-m", "gpuhost_agent", "egress", "remove")
    deadline = time.monotonic() + 10
    while not _reaches(container, METADATA):
        assert time.monotonic() < deadline, "the metadata stand-in is not reached even without the rules"

"""The test Swarm (scripts/swarm-cluster.sh) from Python: bring it up and down,
run `docker` against one node's own engine, deploy a stack on the manager,
and list what a cluster could leave behind on this machine."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from gpuhost_agent.local_marketplace import shapes
from gpuhost_agent.protocol import wire
from support.stacks import TEST_IMAGE
from support.waiting import until

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "swarm-cluster.sh"
PREFIX = "gpuhost-swarm"
LOCK = Path("/run") / f"{PREFIX}.lock"  # held by the run whose cluster is up


# A rental's stack for the leader's tests: one GPU service (all the rental's GPUs) and one without.
GPU_STACK = f"""
services:
  train:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "echo train-started; echo to-stderr >&2; trap exit TERM; sleep 3600 & wait"]
    deploy:
      resources:
        reservations:
          devices: [{{driver: nvidia, count: all, capabilities: [gpu]}}]
  web:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "trap exit TERM; sleep 3600 & wait"]
"""


def cluster_gpus(node: int) -> set[str]:
    """The stand-in GPU UUIDs scripts/swarm-cluster.sh gives node `node`."""
    return {f"GPU-5a4d0000-0000-4000-8000-{node:06d}{index:06d}" for index in range(2)}


def labelled(container: dict) -> dict[str, str]:
    """A container of the seed's list: its labels as a dict."""
    return dict(label.split("=", 1) for label in container["Labels"])


async def train_of(renter, rental_id: str, stack_id: str) -> dict | None:
    """The `train` container (GPU_STACK's GPU service) in the stack's list at the marketplace."""
    listed = [c for c in await renter.containers(rental_id, stack_id) if "_train." in c["Name"]]
    return listed[0] if listed else None


async def leader_ready(agent, market) -> None:
    """The leader agent process started, listing both machines' 4 GPUs."""
    await agent.start()
    await until(lambda: shapes.listing(market.store)["totalGPUs"] == 4, timeout=90)


async def applied_trains(renter, stacks: dict[str, str]) -> dict[str, tuple[str, dict]]:
    """{rental id: (stack id, its train container)} once each stack is APPLIED
    and its GPU container listed at the marketplace."""
    trains = {}
    for rental_id, stack_id in stacks.items():
        done = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=120)
        assert done and done["status"] == wire.APPLIED, done
        await until(lambda r=rental_id, s=stack_id: train_of(renter, r, s), timeout=30)
        train = await train_of(renter, rental_id, stack_id)
        assert train is not None
        trains[rental_id] = (stack_id, train)
    return trains


def cluster(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@contextlib.contextmanager
def swarm(nodes: int = 2) -> Iterator[None]:
    """A cluster for the block; afterwards nothing of it is left. The block
    holds LOCK: a cluster found up while nobody holds it was left by a run
    killed before its own `down` (a CI timeout, a stopped session), and is
    taken down first; one whose run is alive is never touched."""
    with open(LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AssertionError(f"another test run holds the test Swarm ({LOCK}); wait for it to end") from None
        if leftovers():
            cluster("down")
        assert leftovers() == [], "a cluster could not be taken down: scripts/swarm-cluster.sh down"
        try:
            cluster("up", str(nodes))
            yield
        finally:
            cluster("down")
        assert leftovers() == []


def docker(node: int, *args: str, stdin: str | None = None, check: bool = True) -> str:
    """`docker ARGS` against node `node`'s engine (1 is the manager): stdout and stderr."""
    env = {**os.environ, "DOCKER_HOST": f"unix:///run/{PREFIX}/n{node}/docker.sock"}
    done = subprocess.run(["docker", *args], input=stdin, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 or not check, done.stdout + done.stderr
    return done.stdout + done.stderr


def deploy(name: str, content: str) -> str:
    """`docker stack deploy` on the manager, with images as the nodes have them;
    a new Swarm refuses its first deploys for a few seconds ("node is missing
    network attachments"). Returns what the command printed."""
    deadline = time.monotonic() + 60
    while True:
        out = docker(1, "stack", "deploy", "--resolve-image", "never", "-c", "-", name, stdin=content, check=False)
        if "Creating service" in out:
            return out
        assert time.monotonic() < deadline, out
        time.sleep(1)


def remove_stack(name: str) -> None:
    """`docker stack rm`, again while Swarm refuses a network a stopping task
    still holds ("is in use by task", moby/moby#30942) or finds it already
    gone ("not found"), as the agent does."""
    deadline = time.monotonic() + 60
    while "in use by task" in (out := docker(1, "stack", "rm", name, check=False)) or "not found" in out:
        assert time.monotonic() < deadline, out
        time.sleep(0.5)
    assert "Error" not in out, out


def node_id(node: int) -> str:
    return docker(node, "info", "-f", "{{.Swarm.NodeID}}").strip()


def container_of(node: int, service: str) -> str:
    """The id of a running container of a Swarm service on that node's engine."""
    deadline = time.monotonic() + 60
    while not (ids := docker(node, "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={service}").split()):
        assert time.monotonic() < deadline, docker(1, "service", "ps", "--no-trunc", service, check=False)
        time.sleep(0.5)
    return ids[0]


def clear() -> None:
    """Puts a shared cluster back as `up` left it for the next test: every stack
    removed, every node active (tests drain one). The removed stacks'
    containers stop in the background for a few seconds more: tests look only
    at their own (by rental, stack or environment), and `down` removes any."""
    for name in docker(1, "stack", "ls", "--format", "{{.Name}}").split():
        remove_stack(name)
    for line in docker(1, "node", "ls", "--format", "{{.ID}} {{.Availability}}").splitlines():
        node_ref, availability = line.split()
        if availability == "Active":
            continue
        set_availability(node_ref, "active")


def set_availability(node_ref: str, availability: str) -> None:
    """`docker node update --availability`, again on "update out of sequence":
    Swarm updates the node itself (its status, its description) between the
    CLI's read of the node's version and its write (a CI run once failed on this)."""
    for _ in range(20):
        out = docker(1, "node", "update", "--availability", availability, node_ref, check=False)
        if "out of sequence" not in out:
            break
        time.sleep(0.5)
    assert "Error" not in out, out


def leftovers() -> list[str]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    mounts = Path("/proc/mounts").read_text()
    engines = subprocess.run(["pgrep", "-f", f"dockerd .*{PREFIX}"], capture_output=True, text=True).stdout
    found = [line for line in namespaces.splitlines() if line.startswith(PREFIX)]
    found += [line for line in mounts.splitlines() if PREFIX in line]
    found += [f"dockerd pid {pid}" for pid in engines.split()]
    found += [str(path) for path in (Path("/run") / PREFIX, Path("/var/lib") / PREFIX) if path.exists()]
    return found

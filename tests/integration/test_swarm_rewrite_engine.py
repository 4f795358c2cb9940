"""The Swarm rewrite (core/swarm/stack_file.py) against a real two-node Swarm
(scripts/swarm-cluster.sh): what it writes, `docker stack deploy` applies in
full, and the containers it starts on either machine are sandboxed, judged by
`docker inspect` on the node that runs them and by the kernel inside them.
"""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
from support.machine_samples import good_host
from support.sandbox_corpus import CORPUS
from support.sandbox_decide import RENTAL_GPUS, decide_file
from support.settings import stack_context
from support.swarm import PREFIX, container_of, deploy, docker, remove_stack

from gpuhost_agent.core.sandbox.context import GIB
from gpuhost_agent.core.sandbox.harden import ALWAYS_DROP, harden
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.core.swarm.stack_file import SwarmPlacement, swarm_stack
from gpuhost_agent.inventory import compliance
from gpuhost_agent.inventory.host_probe import docker_facts
from gpuhost_agent.protocol.requirements import Requirements
from gpuhost_agent.runtime.compose import ComposeRunner, find_compose_command
from gpuhost_agent.runtime.engine.client import DockerEngine

pytestmark = pytest.mark.swarm
CTX = stack_context(project="p", gpu_uuids=RENTAL_GPUS, cpus=1.0, memory_bytes=GIB // 2, pids_limit=512)
BOX = {"image": "gpuhost-test/busybox:1", "command": ["sh", "-c", "trap exit TERM; sleep 3600 & wait"]}
GPU_ASK = {"resources": {"reservations": {"devices": [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]}}}


@pytest.fixture
def nodes(shared_swarm):
    return shared_swarm


def test_rewritten_stack_runs_sandboxed_on_the_machines_the_agent_chose(nodes) -> None:
    home, gpu_machine = nodes
    hardened = harden(
        {
            "services": {
                "train": {**BOX, "deploy": GPU_ASK, "shm_size": str(64 << 20), "restart": "always"},
                "web": {**BOX, "cap_drop": ["CHOWN"], "mem_limit": str(128 << 20)},
                "side": BOX,
            }
        },
        CTX,
    )
    placement = SwarmPlacement(gpu_nodes={RENTAL_GPUS[0]: gpu_machine, RENTAL_GPUS[1]: gpu_machine}, home_node=home)
    stack, _ = swarm_stack(hardened, CTX, placement)
    printed = deploy("rental", json.dumps(stack))
    assert "Ignoring" not in printed, printed  # nothing written that Swarm would silently drop

    expected = {"train": (2, CTX.memory_bytes, RENTAL_GPUS[0]), "web": (1, 128 << 20, "void")}
    expected["side"] = (1, CTX.memory_bytes // 2, "void")  # web and side share the home machine's share
    for service, (machine, memory, visible) in expected.items():
        container = container_of(machine, f"rental_{service}")
        (info,) = json.loads(docker(machine, "inspect", container))
        host = info["HostConfig"]
        assert host["Memory"] == memory and host["NanoCpus"] == 10**9 // (1 if service == "train" else 2), service
        pids = 512 if service == "train" else 256  # web and side share the home machine's processes too
        assert host["PidsLimit"] == pids and host["Privileged"] is False and not host["Devices"], service
        assert {f"CAP_{cap}" for cap in ALWAYS_DROP} <= set(host["CapDrop"]) and not host["CapAdd"], service
        assert host["LogConfig"] == {"Type": "json-file", "Config": {"max-file": "3", "max-size": "50m"}}, service
        assert f"NVIDIA_VISIBLE_DEVICES={visible}" in info["Config"]["Env"], service
        status = docker(machine, "exec", container, "cat", "/proc/1/status")
        assert "NoNewPrivs:\t1" in status, service  # the node's dockerd holds it: Swarm cannot ask
    shm = docker(2, "exec", container_of(2, "rental_train"), "df", "-k", "/dev/shm").split()
    assert shm[-5] == str(64 << 10)  # 1K blocks: shm_size became the tmpfs' size

    (network,) = json.loads(docker(1, "network", "inspect", "rental_default"))
    assert network["Driver"] == "overlay" and network["Attachable"] is False
    refused = docker(2, "run", "--rm", "--network", "rental_default", "gpuhost-test/busybox:1", "true", check=False)
    assert "not manually attachable" in refused or "not found" in refused, refused


def test_every_published_file_the_sandbox_deploys_is_created_by_swarm_as_written(nodes, tmp_path) -> None:
    """Swarm creates every service of every published file the rewrite
    writes, and ignores none of what it was given (the images are not on the
    nodes: the tasks themselves wait for them, which is not this test's point)."""
    home, other = nodes
    compose = ComposeRunner(find_compose_command(), tmp_path / "docker-config")
    deployed = 0
    for path in sorted((CORPUS / "published").glob("[0-9]*.yaml")):
        _, hardened, _ = asyncio.run(decide_file(compose, path.read_text(), tmp_path / path.stem / "s" / "x"))
        if hardened is None:
            continue
        try:
            stack, _ = swarm_stack(hardened, CTX, SwarmPlacement({RENTAL_GPUS[0]: home, RENTAL_GPUS[1]: other}, home))
        except StackRejected:
            continue
        name = f"c{path.name[:2]}"
        printed = deploy(name, json.dumps(stack))
        assert "Ignoring" not in printed and printed.count("Creating service") == len(stack["services"]), printed
        remove_stack(name)
        deployed += 1
    assert deployed >= 5


async def test_doctor_tells_a_swarm_node_whose_engine_holds_no_new_privileges(nodes, monkeypatch) -> None:
    """The probe reads the process behind each engine's socket: the cluster's
    nodes run with --no-new-privileges, this machine's own engine does not, and
    only a Swarm node is judged on it."""
    manager, _ = nodes
    monkeypatch.setenv("DOCKER_HOST", f"unix:///run/{PREFIX}/n1/docker.sock")
    engine = DockerEngine()
    try:
        facts = await docker_facts(engine, None)
    finally:
        await engine.close()
    assert facts["swarm"] == {"state": "active", "nodeId": manager, "manager": True, "nodes": 2}
    assert facts["noNewPrivileges"]["default"] is True and "--no-new-privileges" in facts["noNewPrivileges"]["detail"]
    check = next(c for c in compliance.evaluate(_host(facts), Requirements()) if c.id == "swarm-no-new-privileges")
    assert check.ok and not check.skipped

    facts["noNewPrivileges"] = {"default": False, "detail": "as this machine's own engine"}
    check = next(c for c in compliance.evaluate(_host(facts), Requirements()) if c.id == "swarm-no-new-privileges")
    assert not check.ok and "setuid" in check.summary
    # A Swarm task cannot ask for its own cgroup namespace either: the nodes give it (cgroup v1 here).
    assert facts["cgroupnsPrivate"]["default"] is True, facts["cgroupnsPrivate"]
    check = next(c for c in compliance.evaluate(_host(facts), Requirements()) if c.id == "swarm-cgroupns")
    assert check.ok and not check.skipped

    monkeypatch.delenv("DOCKER_HOST")
    engine = DockerEngine()
    try:
        own = await docker_facts(engine, None)
    finally:
        await engine.close()
    assert own["swarm"]["state"] == "inactive" and own["noNewPrivileges"]["default"] is False
    assert own["cgroupnsPrivate"]["default"] is (own["cgroupVersion"] == "2")  # the engine's own default


def _host(docker_facts: dict) -> dict:
    data = copy.deepcopy(good_host())
    data["host"]["docker"] = docker_facts
    return data

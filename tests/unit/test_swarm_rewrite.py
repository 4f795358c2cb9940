"""The Swarm rewrite of a hardened stack (core/swarm/stack_file.py), as pure
functions, on small stacks that show one rule each. Every published Compose
file the sandbox deploys is written for Swarm in test_published_corpus.py
(with its one run of the real Compose CLI). On a real Swarm:
tests/integration/test_swarm_cluster.py."""

from __future__ import annotations

import pytest
from support.settings import stack_context

from gpuhost_agent.core.sandbox.context import GIB
from gpuhost_agent.core.sandbox.harden import ALWAYS_DROP, harden
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.core.stacks.project_input import label_services
from gpuhost_agent.core.swarm.machine_shares import machine_shares
from gpuhost_agent.core.swarm.stack_file import SwarmPlacement, swarm_stack
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.declared_ports import LABEL as EXPOSED_LABEL
from gpuhost_agent.runtime.declared_ports import labelled_ports

CTX = stack_context(project="p", gpu_uuids=("GPU-a", "GPU-b"), cpus=8.0, memory_bytes=32 * GIB, pids_limit=4096)
PLACED = SwarmPlacement(gpu_nodes={"GPU-a": "node-2", "GPU-b": "node-2"}, home_node="node-1")
GPU_ASK = {"resources": {"reservations": {"devices": [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]}}}


def _stack(services: dict, **top) -> dict:
    return harden({"services": services, **top}, CTX)


def test_gpu_service_pinned_to_its_gpus_machine_others_home_share_divided() -> None:
    hardened = _stack(
        {
            "train": {"image": "x", "deploy": GPU_ASK, "restart": "on-failure:3", "shm_size": str(2 * GIB)},
            "web": {"image": "y", "ports": [{"target": 8080, "protocol": "tcp", "host_ip": "127.0.0.1"}]},
        }
    )
    stack, notices = swarm_stack(hardened, CTX, PLACED)
    train, web = stack["services"]["train"], stack["services"]["web"]
    assert train["deploy"]["placement"] == {"constraints": ["node.id == node-2"]}
    assert web["deploy"]["placement"] == {"constraints": ["node.id == node-1"]}
    assert (
        train["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
        and web["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    )
    # Alone on its machine each gets the whole share; a rental's other services there divide it.
    assert train["deploy"]["resources"] == {"limits": {"memory": str(32 * GIB), "cpus": "8.00", "pids": 4096}}
    crowded, _ = swarm_stack(hardened, CTX, SwarmPlacement(PLACED.gpu_nodes, "node-1", peers={"node-2": 3}))
    assert crowded["services"]["train"]["deploy"]["resources"]["limits"]["memory"] == str(8 * GIB)
    assert train["deploy"]["restart_policy"] == {"condition": "on-failure", "max_attempts": 3}
    assert web["deploy"]["restart_policy"] == {"condition": "none"}
    assert {"type": "tmpfs", "target": "/dev/shm", "tmpfs": {"size": 2 * GIB}} in train["volumes"]
    assert web["ports"] == [{"target": 8080, "protocol": "tcp", "mode": "host"}]
    for service in (train, web):
        assert set(ALWAYS_DROP) <= set(service["cap_drop"]) and service["deploy"]["endpoint_mode"] == "dnsrr"
        assert not {"security_opt", "privileged", "cgroup_parent", "mem_limit", "cpus", "pids_limit"} & set(service)
        assert "devices" not in str(service["deploy"])  # Swarm refuses device reservations: GPUs by UUID
        assert service["logging"]["options"] == {"max-size": "50m", "max-file": "3"}
    assert stack["networks"] == {"default": {"driver": "overlay", "attachable": False}}
    assert notices == []


def test_a_gpu_service_gets_its_share_of_its_own_machine_as_that_machine_reported_it() -> None:
    """Machines differ: the rental's share is of the machine its GPUs are on,
    sized from that machine's own report; its other services keep the share
    the context gives on the home machine."""
    leader = {"cpu": {"logicalCores": 16}, "memory": {"totalBytes": 64 * GIB}}
    big = {"cpu": {"logicalCores": 65}, "memory": {"totalBytes": 514 * GIB}}
    facts = {
        "host": leader,
        "environment": {
            "nodes": [
                {"nodeId": "node-1", "gpus": ["GPU-x", "GPU-y"], "machine": {"this": True}},
                {"nodeId": "node-2", "gpus": list("abcdefgh"), "machine": {"systemData": {"host": big}}},
                {"nodeId": "node-3", "gpus": ["GPU-z"], "machine": {"error": "did not answer"}},
            ]
        },
    }
    gpu_nodes = {**PLACED.gpu_nodes, "GPU-z": "node-3"}
    shares = machine_shares(facts, gpu_nodes, ["GPU-a", "GPU-b", "GPU-z"])
    assert shares == {"node-2": (16.0, 128 * GIB)}  # a quarter of (65 - 1) CPUs and (514 - 2) GiB; node-3 silent
    largest = stack_context(project="p", gpu_uuids=("GPU-a", "GPU-b"), cpus=16.0, memory_bytes=128 * GIB)
    hardened = harden({"services": {"train": {"image": "x", "deploy": GPU_ASK}, "web": {"image": "y"}}}, largest)
    placed = SwarmPlacement(PLACED.gpu_nodes, "node-1", shares=shares, base_share=(CTX.cpus, CTX.memory_bytes))
    stack, _ = swarm_stack(hardened, largest, placed)
    limits = {name: service["deploy"]["resources"]["limits"] for name, service in stack["services"].items()}
    assert limits["train"] == {"memory": str(128 * GIB), "cpus": "16.00", "pids": 4096}
    assert limits["web"] == {"memory": str(32 * GIB), "cpus": "8.00", "pids": 4096}  # the leader's machine


def test_encrypted_overlays_when_the_host_asks() -> None:
    stack, _ = swarm_stack(
        _stack({"a": {"image": "x", "networks": {"back": {"aliases": ["db"]}}}}, networks={"back": {"internal": True}}),
        CTX,
        SwarmPlacement({}, "node-1", encrypted=True),
    )
    assert stack["networks"] == {
        "back": {"driver": "overlay", "attachable": False, "internal": True, "driver_opts": {"encrypted": ""}}
    }
    assert stack["services"]["a"]["networks"] == {"back": {"aliases": ["db"]}}


@pytest.mark.parametrize(
    ("service", "placement", "said"),
    [
        ({"image": "x", "volumes": [{"type": "bind", "source": "/srv", "target": "/d"}]}, PLACED, "a bind mount"),
        ({"image": "x", "mac_address": "02:42:ac:11:00:02"}, PLACED, "mac_address cannot run on a Swarm"),
        ({"image": "x", "deploy": {"mode": "global"}}, PLACED, "would run it on every machine"),
        ({"image": "x", "deploy": {**GPU_ASK, "replicas": 2}}, PLACED, "runs one task"),
        ({"image": "x", "deploy": GPU_ASK}, SwarmPlacement({"GPU-a": "n1"}, "n1"), None),
        ({"image": "x", "deploy": GPU_ASK}, SwarmPlacement({}, "n1"), "GPU GPU-a is on no machine"),
        ({"image": "x", "deploy": {"resources": {"reservations": {"devices": [{"count": 2}]}}}},
         SwarmPlacement({"GPU-a": "n1", "GPU-b": "n2"}, "n1"), "its GPUs are on 2 machines"),
    ],
)  # fmt: skip
def test_what_swarm_cannot_hold_is_refused_with_the_reason(service, placement, said) -> None:
    hardened = _stack({"s": service})
    if said is None:
        swarm_stack(hardened, CTX, placement)
        return
    with pytest.raises(StackRejected, match=said) as refused:
        swarm_stack(hardened, CTX, placement)
    assert str(refused.value).startswith("refused by the sandbox policy: service 's': ")


def test_depends_on_is_said_to_the_renter() -> None:
    _, notices = swarm_stack(_stack({"a": {"image": "x", "depends_on": {"b": {}}}, "b": {"image": "y"}}), CTX, PLACED)
    assert notices == ["service 'a': depends_on does not order a Swarm stack's start; its services start together"]


def test_expose_ports_reach_the_container_as_the_agents_label_never_published() -> None:
    """`docker stack deploy` drops `expose` (a service's spec has no field for it):
    its tcp ports go into the label the tunnels read (runtime/declared_ports.py),
    and nothing more is published."""
    hardened = _stack({"web": {"image": "x", "expose": ["8080", "9000/tcp", "7000-7002", "53/udp"]}})
    stack, _ = swarm_stack(hardened, CTX, PLACED)
    web = stack["services"]["web"]
    assert "expose" not in web and "ports" not in web
    assert web["labels"][EXPOSED_LABEL] == "8080,9000,7000-7002"
    assert labelled_ports(web["labels"]) == {8080, 9000, 7000, 7001, 7002}
    assert hardened["services"]["web"]["labels"].items() <= web["labels"].items()  # the agent's labels kept
    # The deployer lays the agent's labels over the sandbox's output (core/stacks/deployer.py): the ports stay.
    labelled = label_services(stack, "s", "r", "e")["services"]["web"]["labels"]
    assert labelled[EXPOSED_LABEL] == "8080,9000,7000-7002" and labelled[wire.LABEL_STACK] == "s"
    plain, _ = swarm_stack(_stack({"web": {"image": "x"}}), CTX, PLACED)
    assert label_services(plain, "s", "r", "e")["services"]["web"]["labels"][EXPOSED_LABEL] == ""
    with pytest.raises(StackRejected, match="expose 'http' is not a container port"):
        swarm_stack({"services": {"web": {"image": "x", "expose": ["http"]}}}, CTX, PLACED)

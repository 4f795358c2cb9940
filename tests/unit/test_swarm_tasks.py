"""Reading a Swarm manager's answers (inventory/swarm_nodes.py,
core/gpus/allocation.py, runtime/swarm_tasks.py) without a cluster:
the shapes are the Engine API's (`GET /nodes`, `/services`, `/tasks`), as
Engine 20.10 gave them on the test cluster (tests/integration/
test_swarm_stacks_engine.py runs the same code against it)."""

from __future__ import annotations

from gpuhost_agent.core.gpus.allocation import GpuSlot, allocate, environment_slots
from gpuhost_agent.core.stacks.container_list import seed_containers
from gpuhost_agent.inventory.swarm_nodes import nodes_facts
from gpuhost_agent.runtime.declared_ports import LABEL as EXPOSED_LABEL
from gpuhost_agent.runtime.swarm_tasks import NODE_LABEL, stack_containers


def node(node_id: str, gpus: list[str], state: str = "ready", availability: str = "active") -> dict:
    generic = [{"NamedResourceSpec": {"Kind": "NVIDIA-GPU", "Value": uuid}} for uuid in gpus]
    generic.append({"DiscreteResourceSpec": {"Kind": "fpga", "Value": 2}})
    return {
        "ID": node_id,
        "Spec": {"Availability": availability, "Role": "worker"},
        "Description": {"Hostname": f"host-{node_id}", "Resources": {"GenericResources": generic}},
        "Status": {"State": state},
    }


def task(task_id: str, service: str, slot: int, state: str, index: int, **status) -> dict:
    return {
        "ID": task_id,
        "ServiceID": service,
        "NodeID": "n2",
        "Slot": slot,
        "Version": {"Index": index},
        "CreatedAt": "2026-11-26T22:10:05.123456789Z",
        "Spec": {
            "ContainerSpec": {"Image": "busybox", "Labels": {"gpuhost.stack": "s1", "com.docker.stack.namespace": "p"}}
        },
        "Status": {"State": state, **status},
    }


def test_every_nodes_gpus_and_those_of_a_machine_that_takes_no_tasks_out_of_service() -> None:
    facts = nodes_facts(
        [node("n2", ["GPU-c", "GPU-d"], state="down"), node("n1", ["GPU-a", "GPU-b"]), node("n3", ["GPU-a"])]
    )
    assert [(n["nodeId"], n["gpus"]) for n in facts] == [
        ("n1", ["GPU-a", "GPU-b"]),
        ("n2", ["GPU-c", "GPU-d"]),
        ("n3", []),
    ]
    slots = environment_slots({"nodes": facts})
    assert [(s.uuid, s.healthy, s.machine) for s in slots] == [
        ("GPU-a", True, "n1"),
        ("GPU-b", True, "n1"),
        ("GPU-c", False, "n2"),
        ("GPU-d", False, "n2"),
    ]
    assert slots[2].reason == "machine host-n2 is down in the Swarm"
    (paused,) = environment_slots({"nodes": nodes_facts([node("n4", ["GPU-e"], availability="pause")])})
    assert paused.reason == "machine host-n4 is pause in the Swarm" and not paused.healthy


def test_a_rentals_gpus_come_from_one_machine_when_one_has_enough() -> None:
    """A container runs on one machine: its GPUs must be there together."""
    slots = [GpuSlot("a", machine="m1"), GpuSlot("b", machine="m1"), *(GpuSlot(u, machine="m2") for u in "cde")]
    assert allocate(slots, {"x": ["a"]}, "r", 2) == ["c", "d"]  # not b (m1) and c (m2)
    assert allocate(slots, {"x": ["a"]}, "r", 1) == ["b"]  # the tightest fit keeps m2's three whole
    assert allocate(slots, {"x": ["a", "c", "d"]}, "r", 2) == ["b", "e"]  # no machine has two: spread
    assert allocate([GpuSlot(u) for u in "abc"], {"x": ["a"]}, "r", 2) == ["b", "c"]  # one machine as before


def test_the_newest_task_of_each_slot_as_a_container_of_dockers_list() -> None:
    services = [{"ID": "svc-web", "Spec": {"Name": "p_web"}}, {"ID": "svc-job", "Spec": {"Name": "p_job"}}]
    port = {"Protocol": "tcp", "TargetPort": 8080, "PublishedPort": 32768, "PublishMode": "host"}
    tasks = [
        task("t-old", "svc-web", 1, "failed", 10, ContainerStatus={"ContainerID": "c-old", "ExitCode": 1}),
        task(
            "t-new",
            "svc-web",
            1,
            "running",
            20,
            ContainerStatus={"ContainerID": "c-new"},
            PortStatus={"Ports": [port, port]},
        ),
        task(
            "t-job", "svc-job", 1, "failed", 15, ContainerStatus={"ContainerID": "c-job", "ExitCode": 3}, Err="exit 3"
        ),
        task("t-wait", "svc-job", 2, "preparing", 16),
    ]
    raw = stack_containers(services, tasks)
    assert sorted(c["Id"] for c in raw) == ["", "c-job", "c-new"]
    listed = {c["Name"]: c for c in seed_containers(raw)}
    assert list(listed) == ["p_job.1.t-job", "p_job.2.t-wait", "p_web.1.t-new"]
    assert [c["State"] for c in listed.values()] == ["exited (3)", "created", "running"]
    web = listed["p_web.1.t-new"]
    assert web["Ports"] == [{"PrivatePort": 8080, "Type": "tcp", "IP": "0.0.0.0", "PublicPort": 32768}]
    assert {"com.docker.compose.service=web", f"{NODE_LABEL}=n2", "gpuhost.stack=s1"} <= set(web["Labels"])
    assert web["Created"] == 1795731005


def test_a_tasks_expose_ports_are_listed_unpublished_as_on_one_machine() -> None:
    """`expose:` ports reach the container list from the agent's label, as
    Docker lists them on one machine (a PrivatePort alone), so each gets its
    tunnel; a published one is listed once."""
    services = [{"ID": "svc-web", "Spec": {"Name": "p_web"}}]
    port = {"Protocol": "tcp", "TargetPort": 8080, "PublishedPort": 32768, "PublishMode": "host"}
    running = task("t", "svc-web", 1, "running", 20, ContainerStatus={"ContainerID": "c"}, PortStatus={"Ports": [port]})
    running["Spec"]["ContainerSpec"]["Labels"][EXPOSED_LABEL] = "9000,8080,7000-7001"
    (web,) = seed_containers(stack_containers(services, [running]))
    assert web["Ports"] == [
        {"PrivatePort": 7000, "Type": "tcp"},
        {"PrivatePort": 7001, "Type": "tcp"},
        {"PrivatePort": 8080, "Type": "tcp", "IP": "0.0.0.0", "PublicPort": 32768},
        {"PrivatePort": 9000, "Type": "tcp"},
    ]

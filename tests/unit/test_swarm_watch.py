"""The leader's watch over the other machines (core/swarm/watch.py) without a
cluster: which machines are unwell and the words for a stack, what to start
again once a machine is back, and the watch's loop against a scripted
manager. The same code runs against the two-node test cluster in
tests/integration/test_swarm_failures_engine.py."""

from __future__ import annotations

import asyncio

from test_swarm_tasks import node, task

from gpuhost_agent.core.swarm.watch import (
    SwarmMachines,
    SwarmWatch,
    machine_problems,
    restore_plan,
    stack_machine_error,
)
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.swarm_tasks import NODE_LABEL, stack_containers


def container(service: str, node_id: str, state: str = "running", cid: str = "c1", stack: str = "s1") -> dict:
    return {
        "Id": cid,
        "Names": [f"/p_{service}.1.t{cid}"],
        "State": state,
        "Labels": {NODE_LABEL: node_id, wire.LABEL_STACK: stack, "com.docker.compose.service": service},
    }


def test_only_machines_that_are_not_ready_and_active_are_unwell() -> None:
    problems = machine_problems(
        [
            node("n1", []),
            node("n2", [], state="down"),
            node("n3", [], availability="drain"),
            node("n4", [], state="unknown", availability="pause"),
        ]
    )
    assert problems == {
        "n2": "machine host-n2 (Swarm node n2) is down",
        "n3": "machine host-n3 (Swarm node n3) is drain in the Swarm",
        "n4": "machine host-n4 (Swarm node n4) is unknown",
    }


def test_a_stack_is_told_which_of_its_containers_wait_for_which_machine() -> None:
    problems = {"n2": "machine b (Swarm node n2) is down"}
    raw = [
        container("train", "n2"),
        container("eval", "n2", cid="c2"),
        container("web", "n1", cid="c3"),
        container("setup", "n2", state="exited", cid="c4"),  # completed: nothing to run
    ]
    assert stack_machine_error(raw, problems) == (
        "machine b (Swarm node n2) is down: container eval, train cannot run until it is back"
    )
    assert stack_machine_error(raw, {}) == ""


def test_a_task_waiting_for_its_machine_is_listed_on_the_node_it_is_pinned_to() -> None:
    waiting = task("t2", "svc", 1, "pending", 9, Err="no suitable node")
    del waiting["NodeID"]
    waiting["Spec"]["Placement"] = {"Constraints": ["node.id==n2", "node.platform.os == linux"]}
    (listed,) = stack_containers([{"ID": "svc", "Spec": {"Name": "p_train"}}], [waiting])
    assert listed["Labels"][NODE_LABEL] == "n2" and listed["State"] == "created"


def test_once_back_an_ended_service_is_restarted_and_a_new_or_stale_one_is_not() -> None:
    stranded = {"p_train": "old1", "p_web": "old2", "p_eval": "old3", "p_gone": "old4"}
    now = [
        container("train", "n2", state="exited", cid="old1"),  # stopped with its machine: policy `none`
        container("web", "n2", cid="new2"),  # Swarm restarted it (policy `any`)
        container("eval", "n2", cid="old3"),  # the manager's view before the machine reported
    ]
    restart, settled = restore_plan(stranded, now)
    assert restart == {"p_train"} and settled == {"p_web", "p_gone"}


class Manager:
    """What the leader's engine answers: nodes and the environment's containers."""

    def __init__(self) -> None:
        self.nodes = [node("n1", []), node("n2", [])]
        self.containers = [container("train", "n2", cid="old1")]

    async def swarm_list(self, kind: str, labels=None) -> list[dict]:
        assert kind == "nodes"
        return self.nodes

    async def environment_containers(self, env_id: str) -> list[dict]:
        return self.containers


class Watch:
    def __init__(self, machines: SwarmMachines) -> None:
        self.machines, self.errors = machines, []

    async def push(self, stack_id, raw, seen_at, *, may_set_error):
        assert may_set_error
        self.errors.append(self.machines.stack_error(raw))
        return True


async def test_the_watch_tells_the_stack_refreshes_the_listing_and_restarts_what_the_machine_ran() -> None:
    manager, machines = Manager(), SwarmMachines()
    watch, changed, restarted = Watch(machines), [], []

    async def machines_changed() -> None:
        changed.append(dict(machines.problems))

    async def restart(service: str) -> None:
        restarted.append(service)

    swarm = SwarmWatch(manager, watch, machines, lambda: "env-1", machines_changed, restart)  # type: ignore[arg-type]
    await swarm.poll()
    await swarm.poll()  # nothing changed: nothing pushed again
    assert watch.errors == [""] and changed == []

    manager.nodes[1]["Status"]["State"] = "down"
    await swarm.poll()
    assert changed == [{"n2": "machine host-n2 (Swarm node n2) is down"}]
    assert watch.errors[-1].endswith("container train cannot run until it is back")

    manager.nodes[1]["Status"]["State"] = "ready"
    await swarm.poll()  # back, but the manager still shows the container of before: wait
    assert changed[-1] == {} and restarted == [] and watch.errors[-1] == ""
    manager.containers = [container("train", "n2", state="exited", cid="old1")]
    await swarm.poll()
    assert restarted == ["p_train"]
    manager.containers = [container("train", "n2", state="exited", cid="old1")]
    await swarm.poll()
    assert restarted == ["p_train"]  # once
    await asyncio.sleep(0)

"""A Swarm environment's disks, each judged apart (core/disk_watch.py): the
leader measures its own machine through its engine and every other machine
through that machine's agent, and holds each rental to its share of each
machine's disk, sized by the rental's GPUs there. A rental over its share
anywhere has its stacks stopped through Swarm (scaled to no task), not its
containers (Swarm would start new ones). On the real cluster:
tests/integration/test_swarm_disk_engine.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from support.fakes import FakeEngine, FakeReporter

from gpuhost_agent.core.disk_watch import GIB, DiskWatch, DiskWatchParts, DiskWatchSettings
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.inventory.environment import environment_disks
from gpuhost_agent.inventory.machines import MachineDisk, OneMachine
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.swarm_stacks import NAMESPACE_LABEL
from gpuhost_agent.service.config import default_of
from gpuhost_agent.storage.agent_db import AgentDB


def _facts() -> dict:
    """The leader (n1, 1000 GiB, G1 G2) and gpu-2 (n2, 100 GiB, G3 G4)."""
    worker = {"host": {"storage": {"totalBytes": 100 * GIB}}}
    return {
        "host": {"storage": {"totalBytes": 1000 * GIB}},
        "nvml": {"gpus": [{"uuid": "G1"}, {"uuid": "G2"}]},
        "environment": {
            "nodes": [
                {"nodeId": "n1", "hostname": "gpu-1", "gpus": ["G1", "G2"], "machine": {"this": True}},
                {"nodeId": "n2", "hostname": "gpu-2", "gpus": ["G3", "G4"], "machine": {"systemData": worker}},
            ]
        },
    }


def _volume(project: str, size: int) -> dict:
    return {"Labels": {NAMESPACE_LABEL: project}, "UsageData": {"Size": size}}


def _watch(tmp_path, worker_answer: dict, asked: list, stopped: list) -> tuple[DiskWatch, FakeReporter, FakeEngine]:
    db = AgentDB(tmp_path / "agent.db")
    for stack_id, rental_id in (("s1", "r1"), ("s2", "r2")):
        db.stack_status(stack_id, rental_id, "env", f"p-{stack_id}", wire.APPLIED)
    ledger = GpuLedger(db)
    ledger.assignments = {"r1": ["G3"], "r2": ["G1"]}
    running = [
        {"Id": f"c-{stack}", "State": "running", "Labels": {wire.LABEL_RENTAL: rental, wire.LABEL_STACK: stack}}
        for stack, rental in (("s1", "r1"), ("s2", "r2"))
    ]
    engine = FakeEngine(running, df={"Volumes": [_volume("p-s2", 60 * GIB)]})  # the leader's disk
    reporter = FakeReporter()

    async def facts() -> dict:
        return _facts()

    class Environment(OneMachine):  # the leader's machines: the worker's disk figures, through its agent
        async def disk_figures(self, nodes: list[str], timeout: float) -> dict[str, dict]:
            asked.append(nodes)
            return {"n2": worker_answer}

        def disks(self, facts: Mapping[str, Any]) -> list[MachineDisk]:
            return environment_disks(facts)

    class Stacks:  # the Swarm backend's stop: each stack scaled to no task
        async def stop(self, projects: list[str], running: list[dict]) -> None:
            stopped.extend(projects)

    parts = DiskWatchParts(
        engine=engine,
        db=db,
        ledger=ledger,
        reporter=reporter,
        machine_facts=facts,
        busy_rentals=set,
        machines=Environment(),
        stacks=Stacks(),  # type: ignore[arg-type]
    )
    settings = DiskWatchSettings(
        interval=default_of("disk_watch_seconds"),
        floor_bytes=0,  # the other machines' share is the point, not a floor
        rental_disk_bytes=default_of("rental_disk_bytes"),
    )
    watch = DiskWatch(parts=parts, settings=settings)
    return watch, reporter, engine


def test_each_machine_of_the_environment_is_its_own_disk() -> None:
    leader, worker = environment_disks(_facts())
    assert (leader.node, leader.this, leader.total_bytes, leader.gpus) == ("n1", True, 1000 * GIB, {"G1", "G2"})
    assert (worker.node, worker.this, worker.total_bytes, worker.name) == ("n2", False, 100 * GIB, "gpu-2's disk")
    alone_facts = {"host": {"storage": {"totalBytes": GIB}}, "nvml": {"gpus": [{"uuid": "G1"}]}}
    assert environment_disks(alone_facts) == OneMachine().disks(alone_facts)
    (alone,) = OneMachine().disks(alone_facts)
    assert OneMachine().disks(_facts()) != environment_disks(_facts())  # one machine never reads the environment
    assert (alone.node, alone.name, alone.gpus) == ("", "the host's disk", {"G1"})


async def test_a_rental_over_its_share_of_another_machine_has_its_stacks_stopped_through_swarm(tmp_path) -> None:
    """r1 holds one of gpu-2's two GPUs: half of its 100 GiB; it writes 60 GiB
    there. r2 writes 60 GiB on the leader, within half of 1000 GiB."""
    asked: list = []
    stopped: list = []
    watch, reporter, engine = _watch(tmp_path, {"Volumes": [_volume("p-s1", 60 * GIB)]}, asked, stopped)
    await watch.run_once()
    assert asked == [["n2"]] and watch.last_usage == {"r1": 60 * GIB, "r2": 60 * GIB}
    assert stopped == ["p-s1"] and engine.stopped == []
    ((stack_id, status, message),) = reporter.reports
    assert (stack_id, status) == ("s1", wire.ERROR)
    assert "60.00 GiB of gpu-2's disk, above its share of 50.00 GiB" in message


async def test_a_machine_whose_agent_is_silent_is_not_judged(tmp_path) -> None:
    asked: list = []
    stopped: list = []
    watch, reporter, _ = _watch(tmp_path, {"error": "the agent on this machine did not answer"}, asked, stopped)
    await watch.run_once()
    assert asked == [["n2"]] and stopped == [] and reporter.reports == []
    assert watch.last_usage == {"r2": 60 * GIB}

"""A Swarm environment's other machines in the leader's report
(inventory/swarm_nodes.py, inventory/machine_report.py): each node carries
its agent's own systemData or why there is none; the leader judges each
report against the marketplace's requirements; a machine's live figures do
not make the report go out again. Pure, but for MachineReport's caching."""

from __future__ import annotations

import asyncio
import copy

from support.machine_samples import good_host

from gpuhost_agent.core.swarm.machines import SwarmEnvironment, no_disks
from gpuhost_agent.inventory.machine_report import FRESH_SECONDS, MachineReport
from gpuhost_agent.inventory.machines import OneMachine
from gpuhost_agent.inventory.swarm_nodes import attach_machines
from gpuhost_agent.inventory.system_data import build_report
from gpuhost_agent.protocol.requirements import Requirements

GIB = 1024**3


def _machine(hostname: str) -> dict:
    data = good_host()
    data.update(probedAt="2026-11-27T10:00:00Z", agentVersion="0.1.0", hostname=hostname, networkSpeed=None)
    data["host"].update(cpu={"model": "EPYC", "physicalCores": 64, "logicalCores": 128}, memory={"totalBytes": GIB})
    data["host"]["storage"]["freeBytes"] = 800 * GIB
    return data


def _environment(reports: dict) -> dict:
    """The leader's systemData for nodes n1 (itself), n2 and n3."""
    data = _machine("leader")
    environment = {
        "nodes": [{"nodeId": f"n{i}", "hostname": f"gpu-{i}", "gpus": []} for i in (1, 2, 3)],
        "gpus": 0,
        "error": None,
    }
    attach_machines(environment, "n1", reports)
    data["environment"] = environment
    return data


def _check(data: dict) -> dict:
    checks = build_report(data, Requirements(), None)["compliance"]["checks"]
    return next(check for check in checks if check["id"] == "swarm-machines")


def test_each_machine_is_judged_by_its_own_report() -> None:
    broken = _machine("gpu-3")
    broken["nvml"]["driverVersion"] = "470.57.02"  # too old for the requirements
    data = _environment({"n2": {"systemData": _machine("gpu-2")}, "n3": {"systemData": broken}})
    nodes = {node["nodeId"]: node["machine"] for node in data["environment"]["nodes"]}
    assert nodes["n1"] == {"this": True} and nodes["n2"]["systemData"]["hostname"] == "gpu-2"
    check = _check(data)
    assert not check["ok"] and "gpu-3 (driver-version)" in check["summary"] and "gpu-2" not in check["summary"]
    report = build_report(data, Requirements(), None)
    assert not report["compliance"]["isCompliant"]


def test_a_silent_machine_is_named_not_failed() -> None:
    data = _environment({"n2": {"systemData": _machine("gpu-2")}, "n3": {"error": "did not answer"}})
    assert data["environment"]["nodes"][2]["machine"] == {"error": "did not answer"}
    check = _check(data)
    assert check["ok"] and not check["skipped"] and "no report from gpu-3" in check["summary"]
    silent = _check(_environment({}))
    assert silent["ok"] and silent["skipped"] and "gpu-2, gpu-3" in silent["summary"]


def test_on_one_machine_there_is_no_such_check() -> None:
    checks = build_report(_machine("solo"), Requirements(), None)["compliance"]["checks"]
    assert "swarm-machines" not in {check["id"] for check in checks}


def test_another_machines_live_figures_do_not_change_the_fingerprint() -> None:
    base = build_report(_environment({"n2": {"systemData": _machine("gpu-2")}}), Requirements(), None)
    later = _machine("gpu-2")
    later["probedAt"] = "2026-11-27T10:05:00Z"
    later["host"]["storage"]["freeBytes"] += 200 * 1024**2
    later["host"]["clock"]["maxErrorMs"] = 42.0
    again = build_report(_environment({"n2": {"systemData": later}}), Requirements(), None)
    assert again["fingerprint"] == base["fingerprint"]
    changed = copy.deepcopy(later)
    changed["nvml"]["gpus"].pop()
    moved = build_report(_environment({"n2": {"systemData": changed}}), Requirements(), None)
    assert moved["fingerprint"] != base["fingerprint"]


class _Prober:
    def __init__(self) -> None:
        self.probes = 0
        self.nvml = self

    async def system_data(self) -> dict:
        self.probes += 1
        await asyncio.sleep(0.01)
        return {"probe": self.probes}

    def telemetry(self) -> list[dict]:
        return [{"index": 0, "utilizationPercent": 7}]


async def test_a_machine_report_probes_once_then_answers_at_once_and_refreshes_behind() -> None:
    prober, now = _Prober(), [0.0]
    report = MachineReport(prober, clock=lambda: now[0])  # type: ignore[arg-type]
    answers = await asyncio.gather(*(report.current() for _ in range(5)))
    assert prober.probes == 1 and all(a["systemData"] == {"probe": 1} for a in answers)
    assert answers[0]["telemetry"] == {"gpus": [{"index": 0, "utilizationPercent": 7}]}
    now[0] = FRESH_SECONDS + 1
    stale = await report.current()
    assert stale["systemData"] == {"probe": 1}  # answered as it was
    await asyncio.sleep(0.05)
    assert prober.probes == 2 and (await report.current())["systemData"] == {"probe": 2}
    now[0] = 3 * FRESH_SECONDS
    assert await report.live() == {"telemetry": answers[0]["telemetry"]}
    await asyncio.sleep(0.05)
    assert prober.probes == 2  # a heartbeat's question never starts a probe
    await report.close()


def test_the_environment_is_listed_as_its_machines_together() -> None:
    """Two machines that reported: the listing counts both; the GPU figures
    are the ones any GPU of the environment has."""
    smaller = _machine("gpu-2")
    smaller["nvml"].update(cudaDriverVersion="12.2")
    smaller["nvml"]["gpus"] = [
        {**gpu, "memoryTotalBytes": 40 * GIB, "nvlinkLinksUp": 0} for gpu in smaller["nvml"]["gpus"]
    ]
    data = _environment({"n2": {"systemData": smaller}, "n3": {"error": "did not answer"}})
    data["environment"]["gpus"] = 6  # Swarm's count: the silent machine's GPUs too
    listing = build_report(data, Requirements(), None)["listing"]
    assert listing["totalGPUs"] == 6
    assert (listing["totalCPUs"], listing["totalRAM"], listing["totalStorage"]) == (256, 2.0, 4000)
    assert (listing["gpuVRAM"], listing["gpuCUDA"], listing["gpuInterconnect"]) == (40, "12.2", "PCIe")
    alone = build_report(_machine("leader"), Requirements(), None)["listing"]
    assert (alone["totalCPUs"], alone["gpuVRAM"], alone["gpuCUDA"], alone["gpuInterconnect"]) == (
        128,
        80,
        "12.4",
        "NVLink",
    )


def test_a_machine_that_could_not_measure_a_figure_leaves_the_total_unknown() -> None:
    unmeasured = _machine("gpu-2")
    unmeasured["host"]["storage"]["totalBytes"] = None
    listing = build_report(_environment({"n2": {"systemData": unmeasured}}), Requirements(), None)["listing"]
    assert listing["totalStorage"] is None and listing["totalCPUs"] == 256


async def test_the_heartbeat_asks_the_other_machines_only_where_there_are_some() -> None:
    """The heartbeat's `machines` come from the seam: a leader asks the other
    machines' agents for their live figures alone, and names none before any
    machine is known; one machine is never asked."""
    asked: list[tuple[list[str], bool]] = []

    async def reports(nodes: list[str], timeout: float, live: bool) -> dict[str, dict]:
        asked.append((nodes, live))
        return {"n2": {"telemetry": {"gpus": [{"uuid": "GPU-2"}]}}, "n3": {"error": "did not answer"}}

    leader = SwarmEnvironment(None, reports, no_disks, None)  # type: ignore[arg-type]
    figures = await leader.beat_figures(_environment({}), 5.0)
    assert asked == [(["n2", "n3"], True)]
    assert figures == {"n2": {"gpus": [{"uuid": "GPU-2"}]}, "n3": {"error": "did not answer"}}
    assert await leader.beat_figures(_machine("leader"), 5.0) is None and len(asked) == 1
    assert await OneMachine().beat_figures(_environment({}), 5.0) is None

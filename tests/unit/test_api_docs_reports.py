"""Keep the machine reports the agent sends in step with docs/agent-api.yaml:
systemData and initState as a reporter sends them, heartbeats (a Swarm
leader's too), and what the real probes report on stand-in machines, all
validated against the documented schemas with no field the documents do not
describe. (Enums, units, the Listing and the endpoints: test_api_docs_machine.py.)
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import fake_nvml  # the stand-in NVML library's helper, imported here and not on the loop
from support.doc_reporter import outbox_bodies, session_reporter
from support.fakes import FakeEngine, FakeReleases
from support.machine_samples import GIB, GPU_BEATS, broken_system_data, healthy_system_data
from support.openapi_check import check, check_named, properties, request_schema, response_schema, schema

from gpuhost_agent.core import init_state
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.init_state import InitState
from gpuhost_agent.core.swarm.machines import SwarmEnvironment, no_disks
from gpuhost_agent.core.swarm.watch import SwarmMachines
from gpuhost_agent.inventory import host_probe, telemetry
from gpuhost_agent.inventory.system_data import build_report
from gpuhost_agent.local_marketplace import host_api
from gpuhost_agent.local_marketplace.state import DEFAULT_INTERVALS, MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import wire_time
from gpuhost_agent.protocol.requirements import Requirements
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.outbox import INIT_STATE, SYSTEM_DATA


async def test_system_data_and_init_state_the_agent_sends_are_documented(agent_doc: dict) -> None:
    body_schema = request_schema(agent_doc, "/agent/system-data", "put")
    # build_report itself, for a rentable and for a broken machine
    for data in (healthy_system_data(), broken_system_data()):
        report = build_report(data, Requirements(), None)
        check(agent_doc, {**report, "reportedAt": wire_time.iso()}, body_schema)
    broken = build_report(broken_system_data(), Requirements(), None)
    assert broken["compliance"]["isCompliant"] is False and broken["listing"]["gpuVRAM"] is None

    # what HostReporter really queues, after a session with the local marketplace's requirements
    state = MarketplaceState(Store.load_or_create(None))
    reporter, outbox, _client = session_reporter(state, healthy_system_data())
    report = await reporter.refresh(force=True)
    await reporter.refresh()  # same probe, same fingerprint: nothing new is sent
    (sent,) = outbox_bodies(outbox, SYSTEM_DATA)
    check(agent_doc, sent, body_schema)
    check_named(agent_doc, sent["systemData"], "SystemData")  # the request schema leaves it open
    assert set(sent) == properties(agent_doc, "SystemDataReport")
    assert set(sent["systemData"]) == properties(agent_doc, "SystemData") - {"environment"}  # a Swarm leader's
    assert set(sent["systemData"]["nvml"]) == properties(agent_doc, "NvmlInventory")
    assert set(sent["systemData"]["nvml"]["gpus"][0]) == set(schema(agent_doc, "NvmlGpu")["required"])
    assert set(sent["systemData"]["host"]) == properties(agent_doc, "HostFacts")
    assert set(sent["systemData"]["host"]["docker"]) == properties(agent_doc, "DockerFacts")
    assert set(sent["systemData"]["networkSpeed"]) == properties(agent_doc, "NetworkSpeed")
    checks = sent["compliance"]["checks"]
    assert [c["id"] for c in checks] == schema(agent_doc, "ComplianceCheck")["properties"]["id"]["examples"]
    assert sent["compliance"] == {"isCompliant": True, "failedComplianceReason": "", "checks": checks}
    # the units of the listing fields, on this machine: two readable H100 of 81559 MiB, GPU 1 without a
    # power limit, GPU 2 lost
    assert sent["listing"] == {
        "totalGPUs": 2,
        "gpuName": "NVIDIA H100 80GB HBM3",
        "gpuVRAM": 80,
        "gpuBandwidth": 3352.3,
        "gpuInterconnect": "NVLink",
        "gpuCUDA": "12.4",
        "totalCPUs": 224,
        "totalRAM": round(2164236267520 / GIB, 1),
        "totalStorage": 3577,
        "networkUploadSpeed": 941.2,
        "networkDownloadSpeed": 936.8,
        "location": "DE-Frankfurt",
    }
    assert sent["fingerprint"] == report["fingerprint"]
    assert host_api.system_data_problem(sent) is None
    # the optional `skipped` is a boolean when given (schemathesis found `{}` taken)
    garbled = copy.deepcopy(sent)
    garbled["compliance"]["checks"][0]["skipped"] = {}
    assert "skipped, a boolean" in (host_api.system_data_problem(garbled) or "")
    del garbled["compliance"]["checks"][0]["skipped"]
    assert host_api.system_data_problem(garbled) is None  # older agents leave it out

    # initState: every change the start-up goes through, as the agent reports it
    init = reporter.init
    init.done("config")
    init.begin("marketplace")
    init.done("marketplace", "session s")
    init.begin("docker")
    init.failed("docker", "Docker Engine unreachable: Cannot connect to the Docker daemon")
    init.done("docker", "Docker Engine 27.3.1")
    init.begin("compose")
    init.done("compose", "docker compose")
    init.begin("hardware")
    init.done("hardware", "2 GPU(s), 224 CPUs")
    init.begin("compliance")
    init.done("compliance", "compliant")
    init.ready()
    states = outbox_bodies(outbox, INIT_STATE)
    assert [s["state"] for s in states][3:6] == ["starting", "failed", "starting"]
    assert states[-1]["state"] == "ready" and states[-1]["phase"] is None
    init_schema = request_schema(agent_doc, "/agent/init-state", "put")
    for body in states:
        check(agent_doc, body, init_schema)
        assert host_api.init_state_problem(body) is None
    assert states[4]["error"] == "docker: Docker Engine unreachable: Cannot connect to the Docker daemon"
    assert set(states[0]) == properties(agent_doc, "InitState")
    assert [p["name"] for p in states[0]["phases"]] == list(init_state.PHASES)
    check(agent_doc, InitState().as_wire(), init_schema)


async def test_heartbeats_the_agent_sends_are_documented(agent_doc: dict, tmp_path) -> None:
    state = MarketplaceState(Store.load_or_create(None))
    ledger = GpuLedger(AgentDB(tmp_path / "agent.db"))
    reporter, outbox, client = session_reporter(state, healthy_system_data(), ledger)
    reporter.beat_facts.append(FakeReleases().session_info)  # the composition root adds the upgrades' account
    await reporter.beat()  # before any systemData: no fingerprint to compare, nothing asked for
    await reporter.refresh(force=True)
    await reporter.beat()  # the marketplace has no systemData yet: it asks, and the agent sends it again
    first, second = outbox_bodies(outbox, SYSTEM_DATA)
    assert state.accept_system_data(json.loads(json.dumps(second)))
    await reporter.beat()  # now the fingerprints agree
    assert [reply["systemDataWanted"] for reply in client.replies] == [False, True, False]
    assert second["fingerprint"] == first["fingerprint"] and len(outbox_bodies(outbox, SYSTEM_DATA)) == 2
    beat_schema = request_schema(agent_doc, "/agent/heartbeat", "post")
    reply_schema = response_schema(agent_doc, "/agent/heartbeat", "post", 200)
    # gpuAssignments from the first probe on (before it, the machine's GPUs are not known)
    assert "gpuAssignments" not in client.beats[0] and "gpuAssignments" in client.beats[-1]
    for body in client.beats:
        check(agent_doc, body, beat_schema)
        assert set(body) | {"gpuAssignments", "machines"} == properties(agent_doc, "Heartbeat")
        assert set(body["host"]) == properties(agent_doc, "HeartbeatHost")
        assert host_api.heartbeat_problem(body) is None
    assert client.beats[0]["fingerprint"] is None and client.beats[1]["fingerprint"] == first["fingerprint"]
    for reply in client.replies:
        check(agent_doc, json.loads(json.dumps(reply)), reply_schema)
        assert reply["heartbeatIntervalSeconds"] == DEFAULT_INTERVALS["heartbeatSeconds"]


async def test_a_swarm_leaders_heartbeat_carries_the_other_machines_gpus(agent_doc: dict, tmp_path) -> None:
    """`machines`: each other machine's GPU figures as its agent read them, or
    why none; a silent agent may hold the beat back 3 s at most."""
    data = healthy_system_data()
    machine = {"nodeId": "n2", "hostname": "gpu-2", "gpus": [], "machine": {"systemData": healthy_system_data()}}
    data["environment"] = {
        "nodes": [{"nodeId": "n1", "hostname": "gpu-1", "gpus": [], "machine": {"this": True}}, machine],
        "gpus": 0,
        "error": None,
    }
    reporter, _outbox, client = session_reporter(MarketplaceState(Store.load_or_create(None)), data)
    asked = []

    async def machines(nodes: list[str], timeout: float, live: bool) -> dict:
        asked.append((nodes, timeout, live))
        return {"n2": {"systemData": {}, "telemetry": {"gpus": GPU_BEATS}}, "n3": {"error": "did not answer"}}

    reporter.prober.machines = SwarmEnvironment(None, machines, no_disks, SwarmMachines())  # type: ignore[arg-type]
    await reporter.beat()  # no systemData yet: no machines known
    await reporter.refresh(force=True)
    await reporter.beat()
    assert "machines" not in client.beats[0] and asked == [(["n2"], 3.0, True)]  # the figures alone
    body = client.beats[-1]
    assert body["machines"] == {"n2": {"gpus": GPU_BEATS}, "n3": {"error": "did not answer"}}
    check(agent_doc, body, request_schema(agent_doc, "/agent/heartbeat", "post"))
    assert host_api.heartbeat_problem(body) is None
    for wrong, problem in (
        ({"n2": {"gpus": [{"uuid": "x"}]}}, "machines.n2.gpus[0] must be an object with an index"),
        ({"n2": {}}, "machines.n2 must be an object with gpus (array) or error (string)"),
        ({"n2": {"gpus": [], "error": "x"}}, "machines.n2 must be an object with gpus (array) or error (string)"),
        ({"n2": {"gpus": "none"}}, "machines.n2.gpus must be an array"),
        ([], "machines must be an object of node ids"),
    ):
        assert host_api.heartbeat_problem({**body, "machines": wrong}) == problem


NVML_PROBE = (
    "import json; from gpuhost_agent.inventory.nvml_probe import NvmlProbe; probe = NvmlProbe(); "
    "print(json.dumps({'inventory': probe.inventory(), 'telemetry': probe.telemetry()}))"
)


def _probe_fake_nvml(tmp_path: Path, gpus: list, **config) -> dict:
    """NvmlProbe's output in a subprocess whose pynvml loads the stand-in NVML library."""
    fake_nvml = pytest.importorskip("support.fake_nvml")
    try:
        env = fake_nvml.subprocess_env(fake_nvml.write_config(tmp_path / "nvml.conf", gpus, **config))
    except RuntimeError as exc:  # pragma: no cover - no C compiler here
        pytest.skip(f"the stand-in NVML library cannot be built: {exc}")
    done = subprocess.run(
        [sys.executable, "-c", NVML_PROBE], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_what_the_real_probes_report_is_documented(agent_doc: dict, tmp_path: Path) -> None:
    """NvmlProbe against the stand-in NVML library (an HGX board with a lost GPU and a GPU
    short of two fields, GeForce cards, no driver) and probe_host on this machine."""

    flawed = fake_nvml.FakeGpu(
        fail={
            "nvmlDeviceGetMaxPcieLinkGeneration": "NOT_SUPPORTED",
            "nvmlDeviceGetPowerManagementLimit": "NOT_SUPPORTED",
        }
    )
    lost = fake_nvml.FakeGpu(fail={"nvmlDeviceGetHandleByIndex": "GPU_IS_LOST"})
    machines = [
        await asyncio.to_thread(_probe_fake_nvml, tmp_path, [*fake_nvml.h100_sxm(2), flawed, lost]),
        await asyncio.to_thread(_probe_fake_nvml, tmp_path, fake_nvml.rtx4090(2)),
        await asyncio.to_thread(_probe_fake_nvml, tmp_path, [], fail={"nvmlInitWithFlags": "DRIVER_NOT_LOADED"}),
    ]
    assert machines[0]["inventory"]["gpus"][2]["unsupported"] == {
        "pcie.genMax": "Not Supported",
        "powerLimitW": "Not Supported",
    }
    assert "error" in machines[0]["inventory"]["gpus"][3] and machines[2]["inventory"]["available"] is False

    docker_info = {
        "ServerVersion": "27.3.1",
        "Version": {"ApiVersion": "1.47"},
        "DockerRootDir": str(tmp_path),
        "Runtimes": {"runc": {}, "nvidia": {}},
        "DefaultRuntime": "runc",
        "CDISpecDirs": [],
    }
    compose = [sys.executable, "-c", "print('v2.29.1')"]
    hosts = [
        await host_probe.probe_host(FakeEngine(info=docker_info), compose, toolkit_config=tmp_path / "config.toml"),
        await host_probe.probe_host(FakeEngine(info=docker_info), None, gpu_check_image="local/cuda-check:1"),
        await host_probe.probe_host(FakeEngine(info=None), None),
    ]
    assert hosts[0]["compose"]["version"] == "2.29.1" and hosts[2]["docker"]["available"] is False

    body_schema = request_schema(agent_doc, "/agent/system-data", "put")
    beat_schema = request_schema(agent_doc, "/agent/heartbeat", "post")
    for machine, host in zip(machines, hosts, strict=True):
        data = {**healthy_system_data(), "nvml": machine["inventory"], "host": host}
        check(agent_doc, {**build_report(data, Requirements(), 1.5), "reportedAt": wire_time.iso()}, body_schema)
        check(
            agent_doc,
            {
                "sentAt": wire_time.iso(),
                "agentVersion": "0.1.0",
                "uptimeSeconds": 3.0,
                "initState": "ready",
                "fingerprint": None,
                "gpus": machine["telemetry"],
                "host": await asyncio.to_thread(telemetry.host_load, "/"),
            },
            beat_schema,
        )

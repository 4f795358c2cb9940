"""Keep the machine reports of docs/agent-api.yaml and docs/local-marketplace-api.yaml
in step with the code: systemData (inventory, compliance, listing fields), initState,
the heartbeat and liveness, the speed test, the requirements a session hands out, and
the machine fields of Environment and Listing.

As in test_api_docs.py: enums, units and defaults in the documents must be the code's,
and what the agent sends and the marketplace answers must validate against the
documented schemas, with no field the documents do not describe.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from support import fake_nvml  # the stand-in NVML library's helper, imported here and not on the loop
from support.fakes import FakeClient, FakeEngine, FakeOutbox, FakeProber, FakeSchedule
from support.machine_samples import GIB, GPU_BEATS, broken_system_data, healthy_system_data, heartbeat
from support.openapi_check import answer, check, check_named, properties, request_schema, response_schema, schema

from gpuhost_agent.core import init_state
from gpuhost_agent.core.gpu_ledger import GpuLedger
from gpuhost_agent.core.host_reporter import HostReporter
from gpuhost_agent.core.init_state import InitState
from gpuhost_agent.inventory import compliance, host_probe, listing, telemetry
from gpuhost_agent.inventory.system_data import build_report
from gpuhost_agent.local_marketplace import host_api, shapes, speedtest_api
from gpuhost_agent.local_marketplace.server import build_app
from gpuhost_agent.local_marketplace.state import DEFAULT_INTERVALS, OFFLINE_AFTER_MISSED_BEATS, MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import intervals as wire_intervals
from gpuhost_agent.protocol import wire
from gpuhost_agent.protocol.requirements import Requirements
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.outbox import INIT_STATE, SYSTEM_DATA

# ---- the machine: systemData, initState, heartbeat, speed test -----------------------


def _reporter(
    state: MarketplaceState, data: dict, ledger: GpuLedger | None = None
) -> tuple[HostReporter, FakeOutbox, FakeClient]:
    """A HostReporter after its session: requirements, intervals and clock from the local marketplace."""
    outbox, client = FakeOutbox(), FakeClient(state)
    reporter = HostReporter(
        client,
        outbox,
        FakeProber(data),
        FakeSchedule(),  # type: ignore[arg-type]
        lambda: ["docker", "compose"],
        lambda _command: None,
        ledger=ledger,
    )
    reply = {
        "sessionId": "s",
        "envId": state.store.envId,
        "serverTime": wire.iso(),
        "requeuedJobs": 0,
        "intervals": state.intervals,
        "requirements": state.requirements,
    }
    now = time.time()
    wired = json.loads(json.dumps(reply))
    reporter.session_opened(wired, wire_intervals.from_reply(wired["intervals"]), now, now)
    return reporter, outbox, client


def _sent(outbox: FakeOutbox, kind: str) -> list[dict]:
    return [body for k, _target, body in outbox.reports if k == kind]


def test_machine_enums_units_and_defaults_match_the_code(agent_doc: dict, local_doc: dict) -> None:
    # requirements: exactly the fields of Requirements, with its defaults and types
    requirements = schema(agent_doc, "Requirements")
    names = [spec.name for spec in dataclasses.fields(Requirements)]
    assert set(requirements["properties"]) == set(requirements["required"]) == set(names)
    assert {k: v["default"] for k, v in requirements["properties"].items()} == dataclasses.asdict(Requirements())
    for spec in dataclasses.fields(Requirements):
        assert requirements["properties"][spec.name]["type"] == {"str": "string", "float": "number"}[spec.type]
    assert "requirements" in schema(agent_doc, "Session")["required"]
    assert MarketplaceState(Store.load_or_create(None)).requirements == dataclasses.asdict(Requirements())
    # one table of interval defaults, the agent's and the marketplace's, as documented
    intervals = schema(agent_doc, "Intervals")["properties"]
    assert wire_intervals.from_reply(None) == {key: float(value) for key, value in DEFAULT_INTERVALS.items()}
    for key, value in DEFAULT_INTERVALS.items():
        assert intervals[key]["default"] == value

    # initState and heartbeat enums
    for doc in (agent_doc, local_doc):
        assert schema(doc, "InitState")["properties"]["state"]["enum"] == list(host_api.INIT_STATES)
        phase = schema(doc, "InitPhase")["properties"]
        assert phase["state"]["enum"] == [init_state.PENDING, init_state.RUNNING, init_state.DONE, init_state.FAILED]
        assert phase["name"]["examples"] == list(init_state.PHASES)
    assert schema(agent_doc, "Heartbeat")["properties"]["initState"]["enum"] == list(host_api.INIT_STATES)
    liveness_states = schema(local_doc, "Liveness")["properties"]["initState"]["enum"]
    assert [s for s in liveness_states if s] == list(host_api.INIT_STATES)

    # compliance check ids: a machine with the toolkit and a known clock skew runs every check
    checks = compliance.evaluate(healthy_system_data(), Requirements(), 0.2)
    ids = [check.id for check in checks]
    assert all(check.ok for check in checks), [check.summary for check in checks if not check.ok]
    for doc in (agent_doc, local_doc):
        id_schema = schema(doc, "ComplianceCheck")["properties"]["id"]
        assert id_schema["examples"] == ids
        assert all(f"`{check_id}`" in id_schema["description"] for check_id in ids)
    assert all(f"`{check_id}`" in agent_doc["info"]["description"] for check_id in ids)

    # listing hardware fields: the same names everywhere, the same units in both documents
    hardware = schema(agent_doc, "ListingHardware")
    produced = listing.listing_fields(healthy_system_data(), None, None)
    assert set(hardware["properties"]) == set(hardware["required"]) == set(shapes.HARDWARE_FIELDS) == set(produced)
    assert {*host_api.LISTING_NUMBERS, *host_api.LISTING_WHOLE, *host_api.LISTING_STRINGS} == set(
        shapes.HARDWARE_FIELDS
    )
    local_listing = schema(local_doc, "Listing")
    for field in shapes.HARDWARE_FIELDS:
        assert local_listing["properties"][field] == hardware["properties"][field], field
        assert field in local_listing["required"]
        assert f"`{field}`" in agent_doc["info"]["description"], f"units of {field} in 'The machine'"

    # shapes that both documents describe are described identically
    for name in (
        "ComplianceCheck",
        "InitState",
        "InitPhase",
        "HeartbeatHost",
        "HeartbeatGpu",
        "HeartbeatGpuUnreadable",
    ):
        assert schema(agent_doc, name) == schema(local_doc, name), name
    assert properties(local_doc, "EnvironmentSystemData") == properties(agent_doc, "SystemData") | {
        "complianceChecks",
        "fingerprint",
        "reportedAt",
    }

    # liveness and the speed test's bounds
    assert agent_doc["paths"]["/agent/heartbeat"]["post"]["x-offline-after-missed-beats"] == OFFLINE_AFTER_MISSED_BEATS
    assert schema(local_doc, "Liveness")["x-offline-after-missed-beats"] == OFFLINE_AFTER_MISSED_BEATS
    download = agent_doc["paths"]["/agent/speedtest/download"]["get"]
    upload = agent_doc["paths"]["/agent/speedtest/upload"]["post"]
    assert download["x-max-bytes"] == speedtest_api.MAX_DOWNLOAD_BYTES
    assert upload["x-max-bytes"] == speedtest_api.MAX_UPLOAD_BYTES
    (bytes_param,) = download["parameters"]
    assert bytes_param["schema"]["default"] == speedtest_api.DEFAULT_DOWNLOAD_BYTES
    defaults = inspect.signature(HostReporter).parameters
    for operation in (download, upload):
        assert f"{defaults['speed_max_bytes'].default:,}" in operation["x-agent-behaviour"]
        assert f"{defaults['speed_max_seconds'].default:g} s" in operation["x-agent-behaviour"]


async def test_system_data_and_init_state_the_agent_sends_are_documented(agent_doc: dict) -> None:
    body_schema = request_schema(agent_doc, "/agent/system-data", "put")
    # build_report itself, for a rentable and for a broken machine
    for data in (healthy_system_data(), broken_system_data()):
        report = build_report(data, Requirements(), None)
        check(agent_doc, {**report, "reportedAt": wire.iso()}, body_schema)
    broken = build_report(broken_system_data(), Requirements(), None)
    assert broken["compliance"]["isCompliant"] is False and broken["listing"]["gpuVRAM"] is None

    # what HostReporter really queues, after a session with the local marketplace's requirements
    state = MarketplaceState(Store.load_or_create(None))
    reporter, outbox, _client = _reporter(state, healthy_system_data())
    report = await reporter.refresh(force=True)
    await reporter.refresh()  # same probe, same fingerprint: nothing new is sent
    (sent,) = _sent(outbox, SYSTEM_DATA)
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
    states = _sent(outbox, INIT_STATE)
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
    reporter, outbox, client = _reporter(state, healthy_system_data(), ledger)
    await reporter.beat()  # before any systemData: no fingerprint to compare, nothing asked for
    await reporter.refresh(force=True)
    await reporter.beat()  # the marketplace has no systemData yet: it asks, and the agent sends it again
    first, second = _sent(outbox, SYSTEM_DATA)
    assert state.accept_system_data(json.loads(json.dumps(second)))
    await reporter.beat()  # now the fingerprints agree
    assert [reply["systemDataWanted"] for reply in client.replies] == [False, True, False]
    assert second["fingerprint"] == first["fingerprint"] and len(_sent(outbox, SYSTEM_DATA)) == 2
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
    reporter, _outbox, client = _reporter(MarketplaceState(Store.load_or_create(None)), data)
    asked = []

    async def machines(nodes: list[str], timeout: float, live: bool) -> dict:
        asked.append((nodes, timeout, live))
        return {"n2": {"systemData": {}, "telemetry": {"gpus": GPU_BEATS}}, "n3": {"error": "did not answer"}}

    reporter.prober.machines = machines
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


def test_environment_and_listing_the_marketplace_shows_are_documented(local_doc: dict) -> None:
    store = Store.load_or_create(None)
    state = MarketplaceState(store)
    # before the agent has said anything
    env = json.loads(json.dumps(shapes.environment(state)))
    check_named(local_doc, env, "Environment")
    assert (env["systemData"], env["initState"], env["isCompliant"]) == ({}, {}, False)
    assert env["failedComplianceReason"] == shapes.NOT_REPORTED
    assert env["heartbeat"] == {
        "online": False,
        "lastBeatAt": None,
        "missedBeats": None,
        "intervalSeconds": DEFAULT_INTERVALS["heartbeatSeconds"],
        "agentVersion": None,
        "uptimeSeconds": None,
        "initState": None,
        "host": None,
        "gpus": None,
    }
    check_named(local_doc, shapes.listing(store), "Listing")

    # after a report, a start-up state and a beat, with one GPU rented out
    report = {**build_report(healthy_system_data(), Requirements(), 0.4), "reportedAt": wire.iso()}
    assert state.accept_system_data(json.loads(json.dumps(report)))
    init = InitState()
    init.done("config")
    init.begin("marketplace")
    assert state.accept_init_state(init.as_wire())
    beat = heartbeat(wire.iso(), initState="starting", fingerprint=report["fingerprint"])
    assert state.accept_heartbeat(beat)["systemDataWanted"] is False
    rental = store.create_rental(name="r", gpu_count=1, end_date=None)
    env = json.loads(json.dumps(shapes.environment(state)))
    check_named(local_doc, env, "Environment")
    check_named(local_doc, env["systemData"], "EnvironmentSystemData")  # the document leaves it open to agents
    assert env["isCompliant"] is True and env["failedComplianceReason"] == ""
    assert env["systemData"]["complianceChecks"] == report["compliance"]["checks"]
    assert env["initState"]["phase"] == "marketplace"
    assert env["heartbeat"]["online"] is True and env["heartbeat"]["gpus"] == GPU_BEATS
    listed = json.loads(json.dumps(shapes.listing(store)))
    check_named(local_doc, listed, "Listing")
    assert listed == env["listing"]
    assert (listed["totalGPUs"], listed["availableGPUs"]) == (2, 1)
    assert {key: listed[key] for key in shapes.HARDWARE_FIELDS} == report["listing"]
    check_named(local_doc, json.loads(json.dumps(shapes.rental(store, rental))), "Rental")
    # offline once OFFLINE_AFTER_MISSED_BEATS beats are missed
    interval = env["heartbeat"]["intervalSeconds"]
    gone = state.liveness(now=time.time() + OFFLINE_AFTER_MISSED_BEATS * interval + 1)
    check_named(local_doc, gone, "Liveness")
    assert (gone["online"], gone["missedBeats"]) == (False, OFFLINE_AFTER_MISSED_BEATS)


async def test_machine_endpoints_answer_as_documented(agent_doc: dict, local_doc: dict) -> None:
    store = Store.load_or_create(None)
    state = MarketplaceState(store)
    app = build_app(state)
    renter = {wire.API_KEY_HEADER: store.renterApiKey}
    agent = {wire.API_KEY_HEADER: store.envApiKey}
    A, L = agent_doc, local_doc
    sd_path, is_path, hb_path = "/agent/system-data", "/agent/init-state", "/agent/heartbeat"
    reporter, outbox, _client = _reporter(state, healthy_system_data())
    await reporter.refresh(force=True)
    reporter.init.done("config")
    (report,) = _sent(outbox, SYSTEM_DATA)
    (init,) = _sent(outbox, INIT_STATE)
    async with TestClient(TestServer(app)) as http:
        reply = await answer(A, await http.put("/v1/agent/system-data", headers=agent, json=report), sd_path, "put")
        assert reply == {"accepted": True, "fingerprint": report["fingerprint"]}
        stale = {**report, "reportedAt": "2000-01-01T00:00:00.000000Z"}
        reply = await answer(A, await http.put("/v1/agent/system-data", headers=agent, json=stale), sd_path, "put")
        assert reply["accepted"] is False
        reply = await answer(A, await http.put("/v1/agent/init-state", headers=agent, json=init), is_path, "put")
        assert reply == {"accepted": True}
        beat = heartbeat(wire.iso(), initState="starting", fingerprint=report["fingerprint"])
        check(A, beat, request_schema(A, hb_path, "post"))
        reply = await answer(A, await http.post("/v1/agent/heartbeat", headers=agent, json=beat), hb_path, "post")
        assert reply["systemDataWanted"] is False
        reply = await answer(
            A,
            await http.post("/v1/agent/heartbeat", headers=agent, json={**beat, "fingerprint": "0123456789abcdef"}),
            hb_path,
            "post",
        )
        assert reply["systemDataWanted"] is True

        env = await answer(
            L, await http.get(f"/v1/environments/{store.envId}", headers=renter), "/environments/{envId}", "get"
        )
        assert env["systemData"]["fingerprint"] == report["fingerprint"] and env["heartbeat"]["online"] is True
        listed = await answer(
            L,
            await http.get(f"/v1/environments/{store.envId}/listing", headers=renter),
            "/environments/{envId}/listing",
            "get",
        )
        assert listed == env["listing"] and listed["gpuVRAM"] == 80

        # the speed test: bounded bytes down, bytes up timed on the marketplace's side
        response = await http.get("/v1/agent/speedtest/download", headers=agent, params={"bytes": "300000"})
        assert response.status == 200 and response.content_type == "application/octet-stream"
        assert response.headers["Cache-Control"] == "no-store"
        assert len(await response.read()) == 300_000
        up_path = "/agent/speedtest/upload"
        reply = await answer(
            A, await http.post("/v1/agent/speedtest/upload", headers=agent, data=b"x" * 600_000), up_path, "post"
        )
        assert reply["receivedBytes"] == 600_000 and reply["seconds"] >= 0

        errors = [
            (
                A,
                sd_path,
                "put",
                await http.put(
                    "/v1/agent/system-data",
                    headers=agent,
                    json={**report, "listing": {**report["listing"], "gpuVRAM": "80 GB"}},
                ),
                400,
            ),
            (A, sd_path, "put", await http.put("/v1/agent/system-data", headers=renter, json=report), 401),
            (
                A,
                is_path,
                "put",
                await http.put("/v1/agent/init-state", headers=agent, json={**init, "state": "up"}),
                400,
            ),
            (A, hb_path, "post", await http.post("/v1/agent/heartbeat", headers=agent, json={"sentAt": "now"}), 400),
            (A, hb_path, "post", await http.post("/v1/agent/heartbeat", headers=renter, json=beat), 401),
            (
                A,
                "/agent/speedtest/download",
                "get",
                await http.get("/v1/agent/speedtest/download", headers=agent, params={"bytes": "0"}),
                400,
            ),
            (
                A,
                "/agent/speedtest/download",
                "get",
                await http.get("/v1/agent/speedtest/download", headers=agent, params={"bytes": "lots"}),
                400,
            ),
            (
                L,
                "/environments/{envId}/listing",
                "get",
                await http.get("/v1/environments/nope/listing", headers=renter),
                404,
            ),
            (
                L,
                "/environments/{envId}/listing",
                "get",
                await http.get(f"/v1/environments/{store.envId}/listing", headers=agent),
                401,
            ),
        ]
        for doc, path, method, response, status in errors:
            assert response.status == status, (method, path, await response.text())
            body = await answer(doc, response, path, method)
            assert body["status"] == status


# ---- the real probes -----------------------------------------------------------------

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
        check(agent_doc, {**build_report(data, Requirements(), 1.5), "reportedAt": wire.iso()}, body_schema)
        check(
            agent_doc,
            {
                "sentAt": wire.iso(),
                "agentVersion": "0.1.0",
                "uptimeSeconds": 3.0,
                "initState": "ready",
                "fingerprint": None,
                "gpus": machine["telemetry"],
                "host": await asyncio.to_thread(telemetry.host_load, "/"),
            },
            beat_schema,
        )

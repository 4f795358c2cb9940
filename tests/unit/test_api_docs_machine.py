"""Keep the machine parts of docs/agent-api.yaml and docs/local-marketplace-api.yaml
in step with the code: the enums, units and defaults of systemData, the heartbeat,
the speed test and the requirements a session hands out; the machine fields of
Environment and Listing; and the machine endpoints' answers.

As in test_api_docs.py: enums, units and defaults in the documents must be the code's,
and what the agent sends and the marketplace answers must validate against the
documented schemas, with no field the documents do not describe. (What the agent
sends as a reporter and what the real probes report: test_api_docs_reports.py.)
"""

from __future__ import annotations

import dataclasses
import json
import time

from aiohttp.test_utils import TestClient, TestServer
from support.doc_reporter import outbox_bodies, session_reporter
from support.machine_samples import GPU_BEATS, healthy_system_data, heartbeat
from support.openapi_check import answer, check, check_named, properties, request_schema, schema

from gpuhost_agent.core import init_state
from gpuhost_agent.core.init_state import InitState
from gpuhost_agent.inventory import compliance, listing
from gpuhost_agent.inventory.system_data import build_report
from gpuhost_agent.local_marketplace import host_api, shapes, speedtest_api
from gpuhost_agent.local_marketplace.server import build_app
from gpuhost_agent.local_marketplace.state import DEFAULT_INTERVALS, OFFLINE_AFTER_MISSED_BEATS, MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import intervals as wire_intervals
from gpuhost_agent.protocol import wire, wire_time
from gpuhost_agent.protocol.requirements import Requirements
from gpuhost_agent.service.config import default_of
from gpuhost_agent.uplink.outbox import INIT_STATE, SYSTEM_DATA


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
    for operation in (download, upload):  # the settings' declared defaults (service/settings_table.py)
        assert f"{default_of('speed_max_bytes'):,}" in operation["x-agent-behaviour"]
        assert f"{default_of('speed_max_seconds'):g} s" in operation["x-agent-behaviour"]


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
        "upgrade": None,
        "uptimeSeconds": None,
        "initState": None,
        "host": None,
        "gpus": None,
    }
    check_named(local_doc, shapes.listing(store), "Listing")

    # after a report, a start-up state and a beat, with one GPU rented out
    report = {**build_report(healthy_system_data(), Requirements(), 0.4), "reportedAt": wire_time.iso()}
    assert state.accept_system_data(json.loads(json.dumps(report)))
    init = InitState()
    init.done("config")
    init.begin("marketplace")
    assert state.accept_init_state(init.as_wire())
    beat = heartbeat(wire_time.iso(), initState="starting", fingerprint=report["fingerprint"])
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
    reporter, outbox, _client = session_reporter(state, healthy_system_data())
    await reporter.refresh(force=True)
    reporter.init.done("config")
    (report,) = outbox_bodies(outbox, SYSTEM_DATA)
    (init,) = outbox_bodies(outbox, INIT_STATE)
    async with TestClient(TestServer(app)) as http:
        reply = await answer(A, await http.put("/v1/agent/system-data", headers=agent, json=report), sd_path, "put")
        assert reply == {"accepted": True, "fingerprint": report["fingerprint"]}
        stale = {**report, "reportedAt": "2000-01-01T00:00:00.000000Z"}
        reply = await answer(A, await http.put("/v1/agent/system-data", headers=agent, json=stale), sd_path, "put")
        assert reply["accepted"] is False
        reply = await answer(A, await http.put("/v1/agent/init-state", headers=agent, json=init), is_path, "put")
        assert reply == {"accepted": True}
        beat = heartbeat(wire_time.iso(), initState="starting", fingerprint=report["fingerprint"])
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

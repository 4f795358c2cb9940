"""Keep docs/agent-api.yaml and docs/local-marketplace-api.yaml in step with the code.

The documents are the protocol's contract for the marketplace team, so a route,
enum value or field that changes in the code without the document (or the other
way round) must fail here:

* both documents are valid OpenAPI 3.1;
* their (method, path) pairs are exactly the routes the local marketplace serves;
* enums and shapes match the names in `gpuhost_agent.protocol.wire` and the functions that
  build the payloads;
* what the agent sends and what the marketplace answers validates against the
  documented schemas, with no field the documents do not describe.

The shared helpers live in support/openapi_check.py; the machine reports (systemData,
initState, heartbeat, speed test) are checked in test_api_docs_machine.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import jsonschema
import pytest
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from support.fakes import FakeClient, FakeDeployer, FakeOutbox
from support.openapi_check import (
    AGENT_DOC,
    AGENT_PREFIX,
    LOCAL_DOC,
    answer,
    check,
    check_named,
    documented_operations,
    load,
    request_schema,
    resolve,
    schema,
    served_operations,
)
from support.settings import defaults, sandbox_for
from support.wiring import agent_for, dispatcher_for

from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.images.pulls_elsewhere import PullsElsewhere
from gpuhost_agent.core.stacks import naming
from gpuhost_agent.core.stacks.container_list import to_seed_container
from gpuhost_agent.core.stacks.deployer import DeployParts, DeploySettings, StackDeployer
from gpuhost_agent.core.stacks.status_reporter import StackRef, StatusReporter
from gpuhost_agent.local_marketplace.server import build_app
from gpuhost_agent.local_marketplace.state import DEFAULT_INTERVALS, MarketplaceState
from gpuhost_agent.local_marketplace.store import LEASE, Store
from gpuhost_agent.protocol import wire, wire_jobs, wire_time
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.outbox import CONTAINERS, JOB_COMPLETE, STATUS

# A `docker ps`-style list entry (docker-py's containers.list(...).attrs) with one
# published port (listed for IPv4 and IPv6, as Docker does) and one unpublished.
DOCKER_LIST_ENTRY = {
    "Id": "4c01db0b339c4a4e0b5e9d0b1f4e8c6f0a7b9d2e3f4a5b6c7d8e9f0a1b2c3d4e",
    "Names": ["/my-web-app-3f2504e0-web-1"],
    "Image": "local/busybox:test",
    "Created": 1714564800,
    "Labels": {
        wire.LABEL_MANAGED: "true",
        wire.LABEL_STACK: "3f2504e0-4f89-11d3-9a0c-0305e82c3301",
        wire.LABEL_RENTAL: "rental-1",
        wire.LABEL_ENV: "env-1",
        "com.docker.compose.project": "my-web-app-3f2504e0",
        "com.docker.compose.service": "web",
    },
    "Ports": [
        {"IP": "0.0.0.0", "PrivatePort": 80, "PublicPort": 32768, "Type": "tcp"},
        {"IP": "::", "PrivatePort": 80, "PublicPort": 32768, "Type": "tcp"},
        {"PrivatePort": 9000, "Type": "udp"},
    ],
    "State": "running",
    "Status": "Up 2 seconds",
}


# ---- 1. valid OpenAPI 3.1 -----------------------------------------------------------


@pytest.mark.parametrize("path", [AGENT_DOC, LOCAL_DOC], ids=lambda p: p.name)
def test_documents_are_valid_openapi_3_1(path: Path) -> None:
    doc = load(path)
    assert doc["openapi"] == "3.1.0"
    validate(doc, cls=OpenAPIV31SpecValidator)
    server = doc["servers"][0]
    assert server["url"] == "{base_url}"
    assert server["variables"]["base_url"]["default"].endswith("/v1")


# ---- 2./3. paths == routes ------------------------------------------------------------


async def test_agent_doc_paths_are_the_agent_routes(agent_doc: dict) -> None:
    served = {op for op in await served_operations() if op[1].startswith(AGENT_PREFIX)}
    documented = documented_operations(agent_doc)
    assert documented == served, (
        f"documented but not served: {sorted(documented - served)};"
        f" served but not documented: {sorted(served - documented)}"
    )


async def test_local_doc_paths_are_the_renter_routes(local_doc: dict) -> None:
    served = {op for op in await served_operations() if not op[1].startswith(AGENT_PREFIX)}
    documented = documented_operations(local_doc)
    assert documented == served, (
        f"documented but not served: {sorted(documented - served)};"
        f" served but not documented: {sorted(served - documented)}"
    )


async def test_planned_agent_endpoints_are_neither_served_nor_listed_as_paths(agent_doc: dict) -> None:
    """Planned endpoints live in x-planned until they exist; then they move to paths.
    (The channel was the last one: x-planned is empty until the next is planned.)"""
    planned = {(entry["method"].upper(), "/v1" + entry["path"]) for entry in agent_doc["x-planned"]}
    assert isinstance(agent_doc["x-planned"], list), "x-planned lists the planned endpoints, if any"
    assert not planned & await served_operations(), "an x-planned endpoint is served now: document it under paths"
    assert not planned & documented_operations(agent_doc)
    description = agent_doc["info"]["description"]
    assert "## Extending the protocol" in description
    for _method, path in planned:
        assert path.removeprefix("/v1") in description


# ---- 4. enums --------------------------------------------------------------------------


def test_status_and_job_type_enums_match_wire(agent_doc: dict, local_doc: dict) -> None:
    assert schema(agent_doc, "ReportedStatus")["enum"] == list(wire.REPORTED_STATUSES)
    assert schema(agent_doc, "JobType")["enum"] == list(wire.JOB_TYPES)
    assert schema(agent_doc, "JobCompletion")["properties"]["outcome"]["enum"] == [
        wire.OUTCOME_SUCCEEDED,
        wire.OUTCOME_FAILED,
    ]
    assert schema(local_doc, "Stack")["properties"]["status"]["enum"] == list(wire.STACK_STATUSES)
    rental_statuses = [wire.RENTAL_ACTIVE, wire.RENTAL_COMPLETE]
    assert schema(local_doc, "Rental")["properties"]["status"]["enum"] == rental_statuses
    assert schema(agent_doc, "JobRental")["properties"]["status"]["enum"] == rental_statuses


def test_headers_labels_and_intervals_match_the_code(agent_doc: dict, local_doc: dict) -> None:
    for doc in (agent_doc, local_doc):
        (scheme,) = doc["components"]["securitySchemes"].values()
        assert (scheme["type"], scheme["in"], scheme["name"]) == ("apiKey", "header", wire.API_KEY_HEADER)
        assert doc["security"] == [{name: []} for name in doc["components"]["securitySchemes"]]
    assert agent_doc["components"]["parameters"]["AgentSession"]["name"] == wire.SESSION_HEADER
    intervals = schema(agent_doc, "Intervals")
    assert set(intervals["properties"]) == set(intervals["required"]) == set(DEFAULT_INTERVALS)
    assert {k: v["default"] for k, v in intervals["properties"].items()} == DEFAULT_INTERVALS
    poll = agent_doc["paths"]["/agent/jobs"]["get"]
    assert poll["x-lease-seconds"] == LEASE.total_seconds()
    description = agent_doc["info"]["description"]
    for label in wire.AGENT_LABELS:
        assert label in description
    stack_id = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
    assert f"`{naming.project_name('My Web App!', stack_id)}`" in description
    assert f"`{naming.provider_stack_id(stack_id)}`" in description


# ---- 5. Container shape ----------------------------------------------------------------


def test_container_schema_is_what_to_seed_container_produces(agent_doc: dict, local_doc: dict) -> None:
    shaped = to_seed_container(DOCKER_LIST_ENTRY)
    published = [port for port in shaped["Ports"] if "PublicPort" in port]
    unpublished = [port for port in shaped["Ports"] if "PublicPort" not in port]
    assert published and unpublished, "the sample must cover both kinds of port"
    for doc in (agent_doc, local_doc):
        container, port = schema(doc, "Container"), schema(doc, "ContainerPort")
        assert set(container["properties"]) == set(shaped)
        assert set(container["required"]) == set(shaped)
        assert set(port["properties"]) == set().union(*(p.keys() for p in shaped["Ports"]))
        assert set(port["required"]) == set.intersection(*(set(p) for p in shaped["Ports"]))
        check_named(doc, shaped, "Container")


# ---- what the agent sends --------------------------------------------------------------


def _raw_job(job_type: str, **overrides) -> dict:
    job = {
        "jobId": "job-1",
        "type": job_type,
        "stackId": "stack-1",
        "rentalId": "rental-1",
        "envId": "env-1",
        "stackName": "web",
        "template": None,
        "rental": {"rentalId": "rental-1", "gpuCount": 1, "endDate": None, "status": "ACTIVE"},
        "deliveries": 1,
        "createdAt": wire_time.iso(),
    }
    if job_type == wire.JOB_DEPLOY:
        job["template"] = {
            "name": "web",
            "description": "",
            "content": "services: {}\n",
            "environmentVariables": {},
            "insecure": False,
            "isBasicAuthEnabled": False,
            "isSSHEnabled": False,
        }
    job.update(overrides)
    return job


async def test_session_request_the_agent_sends_is_documented(agent_doc: dict) -> None:
    client = FakeClient()
    agent = agent_for(client)
    await agent._open_session()
    body_schema = request_schema(agent_doc, "/agent/sessions", "post")
    check(agent_doc, client.info, body_schema)
    assert set(client.info) == set(resolve(agent_doc, body_schema)["properties"])


async def test_reports_the_deployer_sends_are_documented(agent_doc: dict, tmp_path: Path) -> None:
    outbox = FakeOutbox()
    ledger = GpuLedger(AgentDB(tmp_path / "agent.db"))
    deployer_settings = defaults("settle_seconds", "stop_timeout", "stacks_per_rental")
    sandbox = sandbox_for(ledger, None)  # type: ignore[arg-type]
    reporter = StatusReporter(outbox, ledger.db, ledger)  # type: ignore[arg-type]
    parts = DeployParts(
        backend=None,
        engine=None,
        reporter=reporter,
        sandbox=sandbox,
        db=ledger.db,
        images=PullsElsewhere(),
        rental_limit_reached=lambda _rental: False,
    )  # type: ignore[arg-type]
    settings = DeploySettings(stacks_dir=tmp_path / "stacks", home_dir=tmp_path, **deployer_settings)
    deployer = StackDeployer(parts=parts, settings=settings)
    job = wire_jobs.StackJob.from_wire(_raw_job(wire.JOB_DEPLOY, stackId="3f2504e0-4f89-11d3-9a0c-0305e82c3301"))
    ledger.commit(job.rental_id, ["GPU-aacd9ec3-13e4-58c1-ada1-81eabee5fdaa"])  # as a deploy records it
    reporter.status(StackRef.of_job(job), wire.APPLIED, job_id=job.job_id)
    reporter.status(
        StackRef.of_job(job), wire.ERROR, "service 'web' exited with code 3 right after it started", job_id=job.job_id
    )
    await deployer.push_containers(job.stack_id, [DOCKER_LIST_ENTRY])
    status_schema = request_schema(agent_doc, "/agent/stacks/{stackId}/status", "put")
    containers_schema = request_schema(agent_doc, "/agent/stacks/{stackId}/containers", "put")
    kinds = [kind for kind, _target, _body in outbox.reports]
    assert kinds == [STATUS, STATUS, CONTAINERS]
    for kind, _target, body in outbox.reports:
        check(agent_doc, body, status_schema if kind == STATUS else containers_schema)
    applied = outbox.reports[0][2]
    assert set(applied) == set(resolve(agent_doc, status_schema)["properties"])
    assert applied["pStackName"] == "web-3f2504e0"
    assert applied["pStackId"] == naming.provider_stack_id(job.stack_id)


async def test_completions_and_refusals_the_dispatcher_sends_are_documented(agent_doc: dict) -> None:
    outbox, deployer = FakeOutbox(), FakeDeployer(remove_error="remove failed: boom")
    dispatcher = dispatcher_for(deployer, outbox)
    dispatcher.submit(_raw_job(wire.JOB_REMOVE))
    await asyncio.wait_for(deployer.removed.wait(), 5)
    await asyncio.sleep(0)
    dispatcher.submit(_raw_job("gpu.reset", jobId="job-2"))  # a type this agent does not know
    complete_schema = request_schema(agent_doc, "/agent/jobs/{jobId}/complete", "post")
    status_schema = request_schema(agent_doc, "/agent/stacks/{stackId}/status", "put")
    completions = {target: body for kind, target, body in outbox.reports if kind == JOB_COMPLETE}
    statuses = [body for kind, _target, body in outbox.reports if kind == STATUS]
    assert completions["job-1"]["outcome"] == wire.OUTCOME_FAILED
    # "Extending the protocol": an unknown type is completed as failed with a
    # reason, and the stack is reported ERROR with the same reason.
    assert completions["job-2"]["outcome"] == wire.OUTCOME_FAILED
    assert "unknown job type 'gpu.reset'" in completions["job-2"]["errorMsg"]
    assert [s["status"] for s in statuses] == [wire.ERROR]
    assert statuses[0]["errorMsg"] == completions["job-2"]["errorMsg"]
    for body in completions.values():
        check(agent_doc, body, complete_schema)
    for body in statuses:
        check(agent_doc, body, status_schema)


def test_rental_end_job_the_marketplace_sends_is_documented(agent_doc: dict) -> None:
    """Ending a rental queues its stacks' removals, then one rental.end job with no stack."""
    store = Store.load_or_create(None)
    rental = store.create_rental(name="r", gpu_count=2, end_date=None)
    store.create_stack(
        rental["rentalId"],
        {
            "name": "web",
            "description": "",
            "content": "services: {}\n",
            "environmentVariables": {},
            "insecure": False,
            "isBasicAuthEnabled": False,
            "isSSHEnabled": False,
        },
    )
    store.end_rental(rental["rentalId"])
    payloads = [store.job_payload(job) for job in store.deliverable(10)]
    assert [p["type"] for p in payloads] == [wire.JOB_DEPLOY, wire.JOB_REMOVE, wire.JOB_RENTAL_END]
    for payload in payloads:
        check_named(agent_doc, payload, "Job")
    end = payloads[-1]
    assert (end["stackId"], end["stackName"], end["template"]) == ("", "", None)
    assert wire_jobs.StackJob.from_wire(end).type == wire.JOB_RENTAL_END
    with pytest.raises(jsonschema.ValidationError):  # only rental.end may name no stack
        check_named(agent_doc, {**end, "type": wire.JOB_REMOVE}, "Job")


# ---- what the local marketplace answers -------------------------------------------------


async def test_local_marketplace_answers_as_documented(agent_doc: dict, local_doc: dict) -> None:
    store = Store.load_or_create(None)
    app = build_app(MarketplaceState(store))
    renter = {wire.API_KEY_HEADER: store.renterApiKey}
    agent = {wire.API_KEY_HEADER: store.envApiKey}
    A, L = agent_doc, local_doc
    async with TestClient(TestServer(app)) as http:
        # renter: environment, rental, stack
        await answer(L, await http.get("/v1/environments", headers=renter), "/environments", "get")
        env = await answer(
            L, await http.get(f"/v1/environments/{store.envId}", headers=renter), "/environments/{envId}", "get"
        )
        assert store.envApiKey not in json.dumps(env), "a renter key must not reveal the agent's key"
        assert env["apiKey"] == store.envApiKey[:4] + "..." + store.envApiKey[-4:]
        response = await http.post(
            "/v1/rentals", headers=renter, json={"envId": store.envId, "gpuCount": 1, "name": "r1"}
        )
        assert response.status == 201
        rental = await answer(L, response, "/rentals", "post")
        rental_id = rental["rentalId"]
        r_path = "/rentals/{rentalId}"
        await answer(L, await http.get(f"/v1/rentals/{rental_id}", headers=renter), r_path, "get")
        await answer(L, await http.get("/v1/rentals", headers=renter), "/rentals", "get")
        patched = await answer(
            L, await http.patch(f"/v1/rentals/{rental_id}", headers=renter, json={"name": "r2"}), r_path, "patch"
        )
        assert patched == "rental updated"
        template = {
            "name": "My Web App!",
            "description": "demo",
            "content": "services:\n  web:\n    image: x\n",
            "environmentVariables": {"GREETING": "hi"},
        }
        check(L, {"template": template}, request_schema(L, "/rentals/{rentalId}/stacks", "post"))
        response = await http.post(f"/v1/rentals/{rental_id}/stacks", headers=renter, json={"template": template})
        assert response.status == 201
        stack_id = await answer(L, response, "/rentals/{rentalId}/stacks", "post")
        stacks = await answer(
            L, await http.get(f"/v1/rentals/{rental_id}/stacks", headers=renter), "/rentals/{rentalId}/stacks", "get"
        )
        assert [s["status"] for s in stacks] == [wire.APPLYING]

        # agent: session, job, reports, completion
        session = await answer(
            A,
            await http.post(
                "/v1/agent/sessions",
                headers=agent,
                json={
                    "agentVersion": "t",
                    "hostname": "h",
                    "startedAt": wire_time.iso(),
                    "capabilities": list(wire.JOB_TYPES),
                },
            ),
            "/agent/sessions",
            "post",
        )
        agent = {**agent, wire.SESSION_HEADER: session["sessionId"]}
        jobs = await answer(
            A, await http.get("/v1/agent/jobs", headers=agent, params={"wait": "0", "max": "5"}), "/agent/jobs", "get"
        )
        (job,) = jobs["jobs"]
        assert (job["type"], job["stackId"], job["deliveries"]) == (wire.JOB_DEPLOY, stack_id, 1)
        st_path, co_path = "/agent/stacks/{stackId}/status", "/agent/stacks/{stackId}/containers"
        report = {
            "status": wire.APPLIED,
            "errorMsg": "",
            "pStackName": naming.project_name(template["name"], stack_id),
            "pStackId": naming.provider_stack_id(stack_id),
            "jobId": job["jobId"],
            "reportedAt": wire_time.iso(),
        }
        reply = await answer(
            A, await http.put(f"/v1/agent/stacks/{stack_id}/status", headers=agent, json=report), st_path, "put"
        )
        assert reply == {"stackId": stack_id, "accepted": True}
        stale = {**report, "status": wire.APPLYING, "reportedAt": "2000-01-01T00:00:00.000000Z"}
        reply = await answer(
            A, await http.put(f"/v1/agent/stacks/{stack_id}/status", headers=agent, json=stale), st_path, "put"
        )
        assert reply["accepted"] is False
        containers = {"containers": [to_seed_container(DOCKER_LIST_ENTRY)], "observedAt": wire_time.iso()}
        reply = await answer(
            A, await http.put(f"/v1/agent/stacks/{stack_id}/containers", headers=agent, json=containers), co_path, "put"
        )
        assert reply["accepted"] is True
        listed = await answer(
            L,
            await http.get(f"/v1/rentals/{rental_id}/stacks/{stack_id}/containers", headers=renter),
            "/rentals/{rentalId}/stacks/{stackId}/containers",
            "get",
        )
        assert listed == containers["containers"]
        c_path = "/agent/jobs/{jobId}/complete"
        done = {"outcome": wire.OUTCOME_SUCCEEDED, "errorMsg": None, "finishedAt": wire_time.iso()}
        for _ in range(2):  # idempotent
            reply = await answer(
                A, await http.post(f"/v1/agent/jobs/{job['jobId']}/complete", headers=agent, json=done), c_path, "post"
            )
            assert reply["state"] == "completed"

        # removal: the remove job carries no template; REMOVED drops the stack
        removing = await answer(
            L,
            await http.delete(f"/v1/rentals/{rental_id}/stacks/{stack_id}", headers=renter),
            "/rentals/{rentalId}/stacks/{stackId}",
            "delete",
        )
        assert removing["status"] == wire.REMOVING
        jobs = await answer(
            A, await http.get("/v1/agent/jobs", headers=agent, params={"wait": "0"}), "/agent/jobs", "get"
        )
        (job,) = jobs["jobs"]
        assert (job["type"], job["template"]) == (wire.JOB_REMOVE, None)
        contradicting = {**report, "status": wire.APPLIED, "reportedAt": wire_time.iso()}
        reply = await answer(
            A, await http.put(f"/v1/agent/stacks/{stack_id}/status", headers=agent, json=contradicting), st_path, "put"
        )
        assert reply["accepted"] is False
        removed = {**report, "status": wire.REMOVED, "reportedAt": wire_time.iso()}
        for accepted in (True, False):  # REMOVED for a stack already dropped: 200, accepted false
            reply = await answer(
                A, await http.put(f"/v1/agent/stacks/{stack_id}/status", headers=agent, json=removed), st_path, "put"
            )
            assert reply["accepted"] is accepted
        assert (
            await answer(
                L,
                await http.get(f"/v1/rentals/{rental_id}/stacks", headers=renter),
                "/rentals/{rentalId}/stacks",
                "get",
            )
            == []
        )
        ended = await answer(L, await http.delete(f"/v1/rentals/{rental_id}", headers=renter), r_path, "delete")
        assert ended["status"] == wire.RENTAL_COMPLETE

        # errors: documented status, {status, message} body
        errors = [
            (A, "/agent/jobs", "get", await http.get("/v1/agent/jobs", headers=renter), 401),
            (A, "/agent/jobs", "get", await http.get("/v1/agent/jobs", headers=agent, params={"wait": "x"}), 400),
            (
                A,
                st_path,
                "put",
                await http.put(
                    f"/v1/agent/stacks/{stack_id}/status", headers=agent, json={**report, "status": wire.APPLYING}
                ),
                404,
            ),
            (
                A,
                st_path,
                "put",
                await http.put(
                    "/v1/agent/stacks/nope/status", headers=agent, json={**report, "status": wire.ERROR, "errorMsg": ""}
                ),
                400,
            ),
            (
                A,
                co_path,
                "put",
                await http.put(f"/v1/agent/stacks/{stack_id}/containers", headers=agent, json=containers),
                404,
            ),
            (A, c_path, "post", await http.post("/v1/agent/jobs/nope/complete", headers=agent, json=done), 404),
            (A, "/agent/sessions", "post", await http.post("/v1/agent/sessions", headers=agent, data=b"{"), 400),
            (L, "/environments", "get", await http.get("/v1/environments", headers=agent), 401),
            (L, "/environments/{envId}", "get", await http.get("/v1/environments/nope", headers=renter), 404),
            (L, "/rentals", "post", await http.post("/v1/rentals", headers=renter, json={"envId": "nope"}), 404),
            (L, "/rentals", "post", await http.post("/v1/rentals", headers=renter, json={"envId": 1}), 400),
            (
                L,
                "/rentals/{rentalId}/stacks",
                "post",
                await http.post(f"/v1/rentals/{rental_id}/stacks", headers=renter, json={"template": template}),
                400,
            ),
            (
                L,
                "/rentals/{rentalId}/stacks",
                "post",
                await http.post("/v1/rentals/nope/stacks", headers=renter, json={"template": template}),
                404,
            ),
        ]
        for doc, path, method, response, status in errors:
            assert response.status == status, (method, path, await response.text())
            body = await answer(doc, response, path, method)
            assert body["status"] == status

"""Keep docs/agent-api.yaml and docs/local-marketplace-api.yaml in step with the code.

The documents are the protocol's contract for the marketplace team, so a route,
enum value or field that changes in the code without the document (or the other
way round) must fail here:

* both documents are valid OpenAPI 3.1;
* their (method, path) pairs are exactly the routes the local marketplace serves;
* enums and shapes match the names in `gpuhost_agent.wire` and the functions that
  build the payloads;
* what the agent sends and what the marketplace answers validates against the
  documented schemas, with no field the documents do not describe.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import OpenAPIV31SpecValidator, validate

from gpuhost_agent import wire
from gpuhost_agent.agent import Agent
from gpuhost_agent.core import naming
from gpuhost_agent.core.containers import to_seed_container
from gpuhost_agent.core.deployer import StackDeployer
from gpuhost_agent.core.dispatcher import JobDispatcher
from gpuhost_agent import host_reporter, init_state
from gpuhost_agent.host_reporter import HostReporter
from gpuhost_agent.init_state import InitState
from gpuhost_agent.inventory import compliance, host_probe, listing, netspeed, telemetry
from gpuhost_agent.inventory.compliance import Requirements
from gpuhost_agent.inventory.system_data import build_report
from gpuhost_agent.marketplace import host_api, shapes, speedtest_api
from gpuhost_agent.marketplace.server import build_app
from gpuhost_agent.marketplace.state import DEFAULT_INTERVALS, OFFLINE_AFTER_MISSED_BEATS, MarketplaceState
from gpuhost_agent.marketplace.store import LEASE, Store
from gpuhost_agent.outbox import CONTAINERS, INIT_STATE, JOB_COMPLETE, STATUS, SYSTEM_DATA
from gpuhost_agent.runtime.engine import EngineError

DOCS = Path(__file__).resolve().parents[1] / "docs"
AGENT_DOC = DOCS / "agent-api.yaml"
LOCAL_DOC = DOCS / "local-marketplace-api.yaml"
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "options", "head", "trace"}
AGENT_PREFIX = "/v1/agent/"

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


GIB = 1024 ** 3


def _h100(index: int) -> dict:
    """One GPU as inventory/nvml_probe.py reports it (an H100 SXM, every field read)."""
    return {"index": index, "uuid": f"GPU-aacd9ec3-13e4-58c1-ada1-81eabee5fd{index:02x}",
            "name": "NVIDIA H100 80GB HBM3", "pciBusId": f"00000000:{0x18 + 0x12 * index:02X}:00.0",
            "memoryTotalBytes": 81559 * 1024 ** 2, "memoryBusWidthBits": 5120, "maxMemoryClockMHz": 2619,
            "memoryBandwidthGBps": 3352.3, "pcie": {"genCurrent": 5, "genMax": 5, "widthCurrent": 16, "widthMax": 16},
            "nvlinkLinksUp": 18, "computeCapability": "9.0", "migMode": {"current": False, "pending": False},
            "eccMode": {"current": True, "pending": True}, "eccUncorrectedErrors": 0, "powerLimitW": 700.0,
            "unsupported": {}}


def healthy_system_data() -> dict:
    """systemData of a rentable machine, shaped as Prober.system_data() builds it: three
    GPUs, of which GPU 1 could not give some fields (null, named in `unsupported`) and
    GPU 2 fell off the bus."""
    partial = _h100(1)
    partial["pcie"]["genMax"] = partial["powerLimitW"] = partial["migMode"] = None
    partial["unsupported"] = {"pcie.genMax": "Not Supported", "powerLimitW": "Not Supported",
                              "migMode": "Function Not Found"}
    speed = netspeed.SpeedResult(download_mbps=936.8, upload_mbps=941.2, download_bytes=25_000_000,
                                 upload_bytes=25_000_000, measured_at=wire.iso())
    return {
        "probedAt": wire.iso(), "agentVersion": "0.1.0", "hostname": "gpu-host-7",
        "nvml": {"available": True, "error": None, "driverVersion": "550.54.15", "cudaDriverVersion": "12.4",
                 "gpus": [_h100(0), partial,
                          {"index": 2, "error": "GPU is lost", "unsupported": {"handle": "GPU is lost"}}],
                 "unsupported": {}},
        "host": {
            "cpu": {"model": "Intel(R) Xeon(R) Platinum 8480+", "physicalCores": 112, "logicalCores": 224},
            "memory": {"totalBytes": 2164236267520},
            "storage": {"path": "/var/lib/docker", "totalBytes": 3840755982336, "freeBytes": 3500000000000,
                        "error": None},
            "os": {"name": "Ubuntu 22.04.4 LTS", "kernel": "5.15.0-105-generic", "arch": "x86_64"},
            "docker": {"available": True, "error": None, "version": "27.3.1", "apiVersion": "1.47",
                       "rootDir": "/var/lib/docker", "runtimes": ["nvidia", "runc"], "defaultRuntime": "runc",
                       "cdiSpecDirs": ["/etc/cdi", "/var/run/cdi"],
                       "gpuContainers": {"ok": True, "method": "engine-info", "detail": "nvidia runtime registered"}},
            "compose": {"available": True, "version": "2.29.1", "command": "docker compose", "error": None},
            "nvidiaContainerToolkit": {"installed": True, "version": "1.17.8",
                                       "binaries": ["nvidia-container-runtime-hook", "nvidia-ctk"],
                                       "configPath": "/etc/nvidia-container-runtime/config.toml",
                                       "configFound": True, "acceptsEnvvarFromUnprivileged": False},
            "clock": {"synchronized": True, "maxErrorMs": 12.5, "source": "adjtimex"},
        },
        "networkSpeed": netspeed.as_wire(speed),
        "location": "DE-Frankfurt",
    }


def broken_system_data() -> dict:
    """systemData of a machine with no driver, no Docker, no Compose, no toolkit."""
    return {
        "probedAt": wire.iso(), "agentVersion": "0.1.0", "hostname": "new-host",
        "nvml": {"available": False, "error": "NVIDIA driver not loaded (the kernel module is not running)",
                 "driverVersion": None, "cudaDriverVersion": None, "gpus": []},
        "host": {
            "cpu": {"model": None, "physicalCores": None, "logicalCores": 8},
            "memory": {"totalBytes": 33546305536},
            "storage": {"path": "/var/lib/docker", "totalBytes": None, "freeBytes": None,
                        "error": "[Errno 13] Permission denied: '/var/lib/docker'"},
            "os": {"name": None, "kernel": "6.8.0-31-generic", "arch": "x86_64"},
            "docker": {"available": False, "error": "Cannot connect to the Docker daemon", "version": None,
                       "rootDir": None,
                       "gpuContainers": {"ok": False, "method": "none", "detail": "Docker Engine unreachable"}},
            "compose": {"available": False, "version": None, "command": None, "error": "Docker Compose v2 not found"},
            "nvidiaContainerToolkit": {"installed": False, "version": None, "binaries": [],
                                       "configPath": "/etc/nvidia-container-runtime/config.toml",
                                       "configFound": False, "acceptsEnvvarFromUnprivileged": True},
            "clock": {"synchronized": None, "maxErrorMs": None, "source": "unavailable"},
        },
        "networkSpeed": None,
        "location": None,
    }


# Heartbeat GPU figures as NvmlProbe.telemetry() reports them (GPU 2 fell off the bus).
GPU_BEATS = [
    {"index": 0, "uuid": "GPU-aacd9ec3-13e4-58c1-ada1-81eabee5fd00", "utilizationPercent": 97,
     "memoryUsedBytes": 71 * GIB, "temperatureC": 64, "powerW": 612.4},
    {"index": 1, "uuid": "GPU-aacd9ec3-13e4-58c1-ada1-81eabee5fd01", "utilizationPercent": None,
     "memoryUsedBytes": 0, "temperatureC": 31, "powerW": None},
    {"index": 2, "error": "GPU is lost"},
]


# ---- helpers ----------------------------------------------------------------------

def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def agent_doc() -> dict:
    return load(AGENT_DOC)


@pytest.fixture(scope="module")
def local_doc() -> dict:
    return load(LOCAL_DOC)


def documented_operations(doc: dict) -> set[tuple[str, str]]:
    """(METHOD, /v1-prefixed path) for every operation in the document."""
    return {(method.upper(), "/v1" + path)
            for path, item in doc["paths"].items() for method in item if method in HTTP_METHODS}


async def served_operations() -> set[tuple[str, str]]:
    """(METHOD, path) of every route of the local marketplace (HEAD left out: aiohttp adds it to every GET)."""
    app = build_app(MarketplaceState(Store.load_or_create(None)))
    return {(route.method, route.resource.canonical) for route in app.router.routes() if route.method != "HEAD"}


def schema(doc: dict, name: str) -> dict:
    return doc["components"]["schemas"][name]


def _strict(node: Any) -> Any:
    """A copy in which object schemas allow no property they do not list, so that
    a field the code emits but the document does not describe fails validation.
    (The documents themselves leave objects open: the protocol grows additively.)"""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items()}
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def check(doc: dict, instance: Any, target: dict) -> None:
    """Validate instance against a schema of doc (refs resolved within doc), strictly."""
    root = {"$schema": "https://json-schema.org/draft/2020-12/schema", "allOf": [_strict(target)],
            "components": _strict(doc["components"])}
    jsonschema.Draft202012Validator(root).validate(instance)


def check_named(doc: dict, instance: Any, name: str) -> None:
    check(doc, instance, {"$ref": f"#/components/schemas/{name}"})


def resolve(doc: dict, node: dict) -> dict:
    """Follow a local $ref (#/components/...) to its target."""
    while "$ref" in node:
        target: Any = doc
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def response_schema(doc: dict, path: str, method: str, status: int | str) -> dict:
    response = resolve(doc, doc["paths"][path][method]["responses"][str(status)])
    return response["content"]["application/json"]["schema"]


def request_schema(doc: dict, path: str, method: str) -> dict:
    return doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]


async def answer(doc: dict, response, path: str, method: str) -> Any:
    """The JSON body of response, checked against the document's schema for its status."""
    body = await response.json()
    check(doc, body, response_schema(doc, path, method, response.status))
    return body


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
        f"documented but not served: {sorted(documented - served)}; served but not documented: {sorted(served - documented)}")


async def test_local_doc_paths_are_the_renter_routes(local_doc: dict) -> None:
    served = {op for op in await served_operations() if not op[1].startswith(AGENT_PREFIX)}
    documented = documented_operations(local_doc)
    assert documented == served, (
        f"documented but not served: {sorted(documented - served)}; served but not documented: {sorted(served - documented)}")


async def test_planned_agent_endpoints_are_neither_served_nor_listed_as_paths(agent_doc: dict) -> None:
    """Planned endpoints live in x-planned until they exist; then they move to paths."""
    planned = {(entry["method"].upper(), "/v1" + entry["path"]) for entry in agent_doc["x-planned"]}
    assert planned, "x-planned lists the planned endpoints named in 'Extending the protocol'"
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
    assert schema(agent_doc, "JobCompletion")["properties"]["outcome"]["enum"] == [wire.OUTCOME_SUCCEEDED,
                                                                                   wire.OUTCOME_FAILED]
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

class _Outbox:
    def __init__(self) -> None:
        self.reports: list[tuple[str, str, dict]] = []

    def put(self, kind: str, target: str, body: dict) -> None:
        self.reports.append((kind, target, body))


class _SessionClient:
    def __init__(self) -> None:
        self.info: dict | None = None

    async def open_session(self, info: dict) -> dict:
        self.info = info
        return {"sessionId": "s", "envId": "env-1", "requeuedJobs": 0, "intervals": {}}


class _Schedule:
    def every(self, *_args) -> None:
        pass


class _Deployer:
    """Stands in for StackDeployer in the dispatcher: deploy succeeds, remove fails."""

    def __init__(self) -> None:
        self.done = asyncio.Event()

    async def deploy(self, _job) -> str:
        return ""

    async def remove(self, _job) -> str:
        self.done.set()
        return "remove failed: boom"

    def report_status(self, *_args) -> None:
        pass


def _raw_job(job_type: str, **overrides) -> dict:
    job = {"jobId": "job-1", "type": job_type, "stackId": "stack-1", "rentalId": "rental-1", "envId": "env-1",
           "stackName": "web", "template": None, "rental": {"rentalId": "rental-1", "gpuCount": 1,
                                                             "endDate": None, "status": "ACTIVE"},
           "deliveries": 1, "createdAt": wire.iso()}
    if job_type == wire.JOB_DEPLOY:
        job["template"] = {"name": "web", "description": "", "content": "services: {}\n",
                           "environmentVariables": {}, "insecure": False, "isBasicAuthEnabled": False,
                           "isSSHEnabled": False}
    job.update(overrides)
    return job


async def test_session_request_the_agent_sends_is_documented(agent_doc: dict) -> None:
    client = _SessionClient()
    agent = Agent(client, None, None, None, _Schedule())  # type: ignore[arg-type]
    await agent._open_session()
    body_schema = request_schema(agent_doc, "/agent/sessions", "post")
    check(agent_doc, client.info, body_schema)
    assert set(client.info) == set(resolve(agent_doc, body_schema)["properties"])


async def test_reports_the_deployer_sends_are_documented(agent_doc: dict, tmp_path: Path) -> None:
    outbox = _Outbox()
    deployer = StackDeployer(None, None, outbox, tmp_path / "stacks")  # type: ignore[arg-type]
    job = wire.StackJob.from_wire(_raw_job(wire.JOB_DEPLOY, stackId="3f2504e0-4f89-11d3-9a0c-0305e82c3301"))
    deployer.report_status(job, wire.APPLIED)
    deployer.report_status(job, wire.ERROR, "service 'web' exited with code 3 right after it started")
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
    outbox, deployer = _Outbox(), _Deployer()
    dispatcher = JobDispatcher(deployer, outbox)  # type: ignore[arg-type]
    dispatcher.submit(_raw_job(wire.JOB_REMOVE))
    await asyncio.wait_for(deployer.done.wait(), 5)
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
        env = await answer(L, await http.get(f"/v1/environments/{store.envId}", headers=renter),
                           "/environments/{envId}", "get")
        assert store.envApiKey not in json.dumps(env), "a renter key must not reveal the agent's key"
        assert env["apiKey"] == store.envApiKey[:4] + "..." + store.envApiKey[-4:]
        response = await http.post("/v1/rentals", headers=renter,
                                   json={"envId": store.envId, "gpuCount": 1, "name": "r1"})
        assert response.status == 201
        rental = await answer(L, response, "/rentals", "post")
        rental_id = rental["rentalId"]
        r_path = "/rentals/{rentalId}"
        await answer(L, await http.get(f"/v1/rentals/{rental_id}", headers=renter), r_path, "get")
        await answer(L, await http.get("/v1/rentals", headers=renter), "/rentals", "get")
        patched = await answer(L, await http.patch(f"/v1/rentals/{rental_id}", headers=renter, json={"name": "r2"}),
                               r_path, "patch")
        assert patched == "rental updated"
        template = {"name": "My Web App!", "description": "demo", "content": "services:\n  web:\n    image: x\n",
                    "environmentVariables": {"GREETING": "hi"}}
        check(L, {"template": template}, request_schema(L, "/rentals/{rentalId}/stacks", "post"))
        response = await http.post(f"/v1/rentals/{rental_id}/stacks", headers=renter, json={"template": template})
        assert response.status == 201
        stack_id = await answer(L, response, "/rentals/{rentalId}/stacks", "post")
        stacks = await answer(L, await http.get(f"/v1/rentals/{rental_id}/stacks", headers=renter),
                              "/rentals/{rentalId}/stacks", "get")
        assert [s["status"] for s in stacks] == [wire.APPLYING]

        # agent: session, job, reports, completion
        session = await answer(A, await http.post("/v1/agent/sessions", headers=agent,
                                                  json={"agentVersion": "t", "hostname": "h",
                                                        "startedAt": wire.iso(), "capabilities": list(wire.JOB_TYPES)}),
                               "/agent/sessions", "post")
        agent = {**agent, wire.SESSION_HEADER: session["sessionId"]}
        jobs = await answer(A, await http.get("/v1/agent/jobs", headers=agent, params={"wait": "0", "max": "5"}),
                            "/agent/jobs", "get")
        (job,) = jobs["jobs"]
        assert (job["type"], job["stackId"], job["deliveries"]) == (wire.JOB_DEPLOY, stack_id, 1)
        st_path, co_path = "/agent/stacks/{stackId}/status", "/agent/stacks/{stackId}/containers"
        report = {"status": wire.APPLIED, "errorMsg": "", "pStackName": naming.project_name(template["name"], stack_id),
                  "pStackId": naming.provider_stack_id(stack_id), "jobId": job["jobId"], "reportedAt": wire.iso()}
        reply = await answer(A, await http.put(f"/v1/agent/stacks/{stack_id}/status", headers=agent, json=report),
                             st_path, "put")
        assert reply == {"stackId": stack_id, "accepted": True}
        stale = {**report, "status": wire.APPLYING, "reportedAt": "2000-01-01T00:00:00.000000Z"}
        reply = await answer(A, await http.put(f"/v1/agent/stacks/{stack_id}/status", headers=agent, json=stale),
                             st_path, "put")
        assert reply["accepted"] is False
        containers = {"containers": [to_seed_container(DOCKER_LIST_ENTRY)], "observedAt": wire.iso()}
        reply = await answer(A, await http.put(f"/v1/agent/stacks/{stack_id}/containers", headers=agent,
                                               json=containers), co_path, "put")
        assert reply["accepted"] is True
        listed = await answer(L, await http.get(f"/v1/rentals/{rental_id}/stacks/{stack_id}/containers",
                                                headers=renter), "/rentals/{rentalId}/stacks/{stackId}/containers", "get")
        assert listed == containers["containers"]
        c_path = "/agent/jobs/{jobId}/complete"
        done = {"outcome": wire.OUTCOME_SUCCEEDED, "errorMsg": None, "finishedAt": wire.iso()}
        for _ in range(2):  # idempotent
            reply = await answer(A, await http.post(f"/v1/agent/jobs/{job['jobId']}/complete", headers=agent,
                                                    json=done), c_path, "post")
            assert reply["state"] == "completed"

        # removal: the remove job carries no template; REMOVED drops the stack
        removing = await answer(L, await http.delete(f"/v1/rentals/{rental_id}/stacks/{stack_id}", headers=renter),
                                "/rentals/{rentalId}/stacks/{stackId}", "delete")
        assert removing["status"] == wire.REMOVING
        jobs = await answer(A, await http.get("/v1/agent/jobs", headers=agent, params={"wait": "0"}),
                            "/agent/jobs", "get")
        (job,) = jobs["jobs"]
        assert (job["type"], job["template"]) == (wire.JOB_REMOVE, None)
        contradicting = {**report, "status": wire.APPLIED, "reportedAt": wire.iso()}
        reply = await answer(A, await http.put(f"/v1/agent/stacks/{stack_id}/status", headers=agent,
                                               json=contradicting), st_path, "put")
        assert reply["accepted"] is False
        removed = {**report, "status": wire.REMOVED, "reportedAt": wire.iso()}
        for accepted in (True, False):  # REMOVED for a stack already dropped: 200, accepted false
            reply = await answer(A, await http.put(f"/v1/agent/stacks/{stack_id}/status", headers=agent,
                                                   json=removed), st_path, "put")
            assert reply["accepted"] is accepted
        assert await answer(L, await http.get(f"/v1/rentals/{rental_id}/stacks", headers=renter),
                            "/rentals/{rentalId}/stacks", "get") == []
        ended = await answer(L, await http.delete(f"/v1/rentals/{rental_id}", headers=renter), r_path, "delete")
        assert ended["status"] == wire.RENTAL_COMPLETE

        # errors: documented status, {status, message} body
        errors = [
            (A, "/agent/jobs", "get", await http.get("/v1/agent/jobs", headers=renter), 401),
            (A, "/agent/jobs", "get", await http.get("/v1/agent/jobs", headers=agent, params={"wait": "x"}), 400),
            (A, st_path, "put", await http.put(f"/v1/agent/stacks/{stack_id}/status", headers=agent,
                                                json={**report, "status": wire.APPLYING}), 404),
            (A, st_path, "put", await http.put("/v1/agent/stacks/nope/status", headers=agent,
                                                json={**report, "status": wire.ERROR, "errorMsg": ""}), 400),
            (A, co_path, "put", await http.put(f"/v1/agent/stacks/{stack_id}/containers", headers=agent,
                                                json=containers), 404),
            (A, c_path, "post", await http.post("/v1/agent/jobs/nope/complete", headers=agent, json=done), 404),
            (A, "/agent/sessions", "post", await http.post("/v1/agent/sessions", headers=agent, data=b"{"), 400),
            (L, "/environments", "get", await http.get("/v1/environments", headers=agent), 401),
            (L, "/environments/{envId}", "get", await http.get("/v1/environments/nope", headers=renter), 404),
            (L, "/rentals", "post", await http.post("/v1/rentals", headers=renter, json={"envId": "nope"}), 404),
            (L, "/rentals", "post", await http.post("/v1/rentals", headers=renter, json={"envId": 1}), 400),
            (L, "/rentals/{rentalId}/stacks", "post",
             await http.post(f"/v1/rentals/{rental_id}/stacks", headers=renter, json={"template": template}), 400),
            (L, "/rentals/{rentalId}/stacks", "post",
             await http.post("/v1/rentals/nope/stacks", headers=renter, json={"template": template}), 404),
        ]
        for doc, path, method, response, status in errors:
            assert response.status == status, (method, path, await response.text())
            body = await answer(doc, response, path, method)
            assert body["status"] == status


# ---- the machine: systemData, initState, heartbeat, speed test -----------------------

class _Nvml:
    def __init__(self, beats: list[dict]) -> None:
        self.beats = beats

    def telemetry(self) -> list[dict]:
        return copy.deepcopy(self.beats)


class _Prober:
    """Stands in for inventory.system_data.Prober: a fixed probe, fixed GPU figures."""

    def __init__(self, data: dict, beats: list[dict] = GPU_BEATS) -> None:
        self.data = data
        self.nvml = _Nvml(beats)
        self.speed: dict | None = None
        self.compose_command: list[str] | None = ["docker", "compose"]

    async def system_data(self) -> dict:
        return copy.deepcopy(self.data)


class _MachineClient:
    """Hands the agent's heartbeats to a local marketplace's state, as its HTTP handler does."""

    def __init__(self, state: MarketplaceState) -> None:
        self.state = state
        self.beats: list[dict] = []
        self.replies: list[dict] = []

    async def heartbeat(self, body: dict) -> dict:
        body = json.loads(json.dumps(body))
        self.beats.append(body)
        self.replies.append(self.state.accept_heartbeat(body))
        return self.replies[-1]


def _reporter(state: MarketplaceState, data: dict) -> tuple[HostReporter, _Outbox, _MachineClient]:
    """A HostReporter after its session: requirements, intervals and clock from the local marketplace."""
    outbox, client = _Outbox(), _MachineClient(state)
    reporter = HostReporter(client, outbox, _Prober(data), _Schedule(),  # type: ignore[arg-type]
                            lambda: ["docker", "compose"])
    reply = {"sessionId": "s", "envId": state.store.envId, "serverTime": wire.iso(), "requeuedJobs": 0,
             "intervals": state.intervals, "requirements": state.requirements}
    now = time.time()
    reporter.session_opened(json.loads(json.dumps(reply)), now, now)
    return reporter, outbox, client


def _sent(outbox: _Outbox, kind: str) -> list[dict]:
    return [body for k, _target, body in outbox.reports if k == kind]


def _properties(doc: dict, name: str) -> set[str]:
    return set(schema(doc, name)["properties"])


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
    # the agent's own interval defaults are the marketplace's
    intervals = schema(agent_doc, "Intervals")["properties"]
    for key, value in host_reporter.DEFAULT_INTERVALS.items():
        assert intervals[key]["default"] == value == DEFAULT_INTERVALS[key]

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
    assert set(host_api.LISTING_NUMBERS) | set(host_api.LISTING_STRINGS) == set(shapes.HARDWARE_FIELDS)
    local_listing = schema(local_doc, "Listing")
    for field in shapes.HARDWARE_FIELDS:
        assert local_listing["properties"][field] == hardware["properties"][field], field
        assert field in local_listing["required"]
        assert f"`{field}`" in agent_doc["info"]["description"], f"units of {field} in 'The machine'"

    # shapes that both documents describe are described identically
    for name in ("ComplianceCheck", "InitState", "InitPhase", "HeartbeatHost", "HeartbeatGpu",
                 "HeartbeatGpuUnreadable"):
        assert schema(agent_doc, name) == schema(local_doc, name), name
    assert _properties(local_doc, "EnvironmentSystemData") == _properties(agent_doc, "SystemData") | {
        "complianceChecks", "fingerprint", "reportedAt"}

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
    assert set(sent) == _properties(agent_doc, "SystemDataReport")
    assert set(sent["systemData"]) == _properties(agent_doc, "SystemData")
    assert set(sent["systemData"]["nvml"]) == _properties(agent_doc, "NvmlInventory")
    assert set(sent["systemData"]["nvml"]["gpus"][0]) == set(schema(agent_doc, "NvmlGpu")["required"])
    assert set(sent["systemData"]["host"]) == _properties(agent_doc, "HostFacts")
    assert set(sent["systemData"]["host"]["docker"]) == _properties(agent_doc, "DockerFacts")
    assert set(sent["systemData"]["networkSpeed"]) == _properties(agent_doc, "NetworkSpeed")
    checks = sent["compliance"]["checks"]
    assert [c["id"] for c in checks] == schema(agent_doc, "ComplianceCheck")["properties"]["id"]["examples"]
    assert sent["compliance"] == {"isCompliant": True, "failedComplianceReason": "", "checks": checks}
    # the units of the listing fields, on this machine: two readable H100 of 81559 MiB, GPU 1 without a
    # power limit, GPU 2 lost
    assert sent["listing"] == {
        "totalGPUs": 2, "gpuName": "NVIDIA H100 80GB HBM3", "gpuVRAM": 80, "gpuBandwidth": 3352.3,
        "gpuInterconnect": "NVLink", "gpuCUDA": "12.4", "totalCPUs": 224,
        "totalRAM": round(2164236267520 / GIB, 1), "totalStorage": 3577, "networkUploadSpeed": 941.2,
        "networkDownloadSpeed": 936.8, "location": "DE-Frankfurt"}
    assert sent["fingerprint"] == report["fingerprint"]
    assert host_api.system_data_problem(sent) is None

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
    assert set(states[0]) == _properties(agent_doc, "InitState")
    assert [p["name"] for p in states[0]["phases"]] == list(init_state.PHASES)
    check(agent_doc, InitState().as_wire(), init_schema)


async def test_heartbeats_the_agent_sends_are_documented(agent_doc: dict) -> None:
    state = MarketplaceState(Store.load_or_create(None))
    reporter, outbox, client = _reporter(state, healthy_system_data())
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
    for body in client.beats:
        check(agent_doc, body, beat_schema)
        assert set(body) == _properties(agent_doc, "Heartbeat")
        assert set(body["host"]) == _properties(agent_doc, "HeartbeatHost")
        assert host_api.heartbeat_problem(body) is None
    assert client.beats[0]["fingerprint"] is None and client.beats[1]["fingerprint"] == first["fingerprint"]
    for reply in client.replies:
        check(agent_doc, json.loads(json.dumps(reply)), reply_schema)
        assert reply["heartbeatIntervalSeconds"] == DEFAULT_INTERVALS["heartbeatSeconds"]


def test_environment_and_listing_the_marketplace_shows_are_documented(local_doc: dict) -> None:
    store = Store.load_or_create(None)
    state = MarketplaceState(store)
    # before the agent has said anything
    env = json.loads(json.dumps(shapes.environment(state)))
    check_named(local_doc, env, "Environment")
    assert (env["systemData"], env["initState"], env["isCompliant"]) == ({}, {}, False)
    assert env["failedComplianceReason"] == shapes.NOT_REPORTED
    assert env["heartbeat"] == {"online": False, "lastBeatAt": None, "missedBeats": None,
                                "intervalSeconds": DEFAULT_INTERVALS["heartbeatSeconds"], "agentVersion": None,
                                "uptimeSeconds": None, "initState": None, "host": None, "gpus": None}
    check_named(local_doc, shapes.listing(store), "Listing")

    # after a report, a start-up state and a beat, with one GPU rented out
    report = {**build_report(healthy_system_data(), Requirements(), 0.4), "reportedAt": wire.iso()}
    assert state.accept_system_data(json.loads(json.dumps(report)))
    init = InitState()
    init.done("config")
    init.begin("marketplace")
    assert state.accept_init_state(init.as_wire())
    beat = {"sentAt": wire.iso(), "agentVersion": "0.1.0", "uptimeSeconds": 12.5, "initState": "starting",
            "fingerprint": report["fingerprint"], "host": {"load1": 0.5, "load5": 0.4, "load15": 0.3,
                                                           "cpuPercent": 3.5, "memoryUsedBytes": 8 * GIB,
                                                           "memoryTotalBytes": 2015 * GIB, "diskFreeBytes": None},
            "gpus": GPU_BEATS}
    assert state.accept_heartbeat(beat)["systemDataWanted"] is False
    rental = store.create_rental(name="r", gpu_count=1, end_date=None)
    env = json.loads(json.dumps(shapes.environment(state)))
    check_named(local_doc, env, "Environment")
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
        beat = {"sentAt": wire.iso(), "agentVersion": "0.1.0", "uptimeSeconds": 1.0, "initState": "starting",
                "fingerprint": report["fingerprint"], "host": {"load1": 0.1, "load5": 0.1, "load15": 0.1,
                                                               "cpuPercent": 0.0, "memoryUsedBytes": GIB,
                                                               "memoryTotalBytes": 8 * GIB, "diskFreeBytes": GIB},
                "gpus": GPU_BEATS}
        check(A, beat, request_schema(A, hb_path, "post"))
        reply = await answer(A, await http.post("/v1/agent/heartbeat", headers=agent, json=beat), hb_path, "post")
        assert reply["systemDataWanted"] is False
        reply = await answer(A, await http.post("/v1/agent/heartbeat", headers=agent,
                                                json={**beat, "fingerprint": "0123456789abcdef"}), hb_path, "post")
        assert reply["systemDataWanted"] is True

        env = await answer(L, await http.get(f"/v1/environments/{store.envId}", headers=renter),
                           "/environments/{envId}", "get")
        assert env["systemData"]["fingerprint"] == report["fingerprint"] and env["heartbeat"]["online"] is True
        listed = await answer(L, await http.get(f"/v1/environments/{store.envId}/listing", headers=renter),
                              "/environments/{envId}/listing", "get")
        assert listed == env["listing"] and listed["gpuVRAM"] == 80

        # the speed test: bounded bytes down, bytes up timed on the marketplace's side
        response = await http.get("/v1/agent/speedtest/download", headers=agent, params={"bytes": "300000"})
        assert response.status == 200 and response.content_type == "application/octet-stream"
        assert response.headers["Cache-Control"] == "no-store"
        assert len(await response.read()) == 300_000
        up_path = "/agent/speedtest/upload"
        reply = await answer(A, await http.post("/v1/agent/speedtest/upload", headers=agent, data=b"x" * 600_000),
                             up_path, "post")
        assert reply["receivedBytes"] == 600_000 and reply["seconds"] >= 0

        errors = [
            (A, sd_path, "put", await http.put("/v1/agent/system-data", headers=agent,
                                               json={**report, "listing": {**report["listing"], "gpuVRAM": "80 GB"}}),
             400),
            (A, sd_path, "put", await http.put("/v1/agent/system-data", headers=renter, json=report), 401),
            (A, is_path, "put", await http.put("/v1/agent/init-state", headers=agent, json={**init, "state": "up"}),
             400),
            (A, hb_path, "post", await http.post("/v1/agent/heartbeat", headers=agent, json={"sentAt": "now"}), 400),
            (A, hb_path, "post", await http.post("/v1/agent/heartbeat", headers=renter, json=beat), 401),
            (A, "/agent/speedtest/download", "get",
             await http.get("/v1/agent/speedtest/download", headers=agent, params={"bytes": "0"}), 400),
            (A, "/agent/speedtest/download", "get",
             await http.get("/v1/agent/speedtest/download", headers=agent, params={"bytes": "lots"}), 400),
            (L, "/environments/{envId}/listing", "get",
             await http.get("/v1/environments/nope/listing", headers=renter), 404),
            (L, "/environments/{envId}/listing", "get",
             await http.get(f"/v1/environments/{store.envId}/listing", headers=agent), 401),
        ]
        for doc, path, method, response, status in errors:
            assert response.status == status, (method, path, await response.text())
            body = await answer(doc, response, path, method)
            assert body["status"] == status


# ---- the real probes -----------------------------------------------------------------

NVML_PROBE = ("import json; from gpuhost_agent.inventory.nvml_probe import NvmlProbe; probe = NvmlProbe(); "
              "print(json.dumps({'inventory': probe.inventory(), 'telemetry': probe.telemetry()}))")


def _probe_fake_nvml(tmp_path: Path, gpus: list, **config) -> dict:
    """NvmlProbe's output in a subprocess whose pynvml loads the stand-in NVML library."""
    fake_nvml = pytest.importorskip("fake_nvml")
    try:
        env = fake_nvml.subprocess_env(fake_nvml.write_config(tmp_path / "nvml.conf", gpus, **config))
    except RuntimeError as exc:  # pragma: no cover - no C compiler here
        pytest.skip(f"the stand-in NVML library cannot be built: {exc}")
    done = subprocess.run([sys.executable, "-c", NVML_PROBE], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class _Engine:
    """Docker Engine stand-in: `info` answers the given facts, or fails like an absent daemon."""

    def __init__(self, info: dict | None) -> None:
        self._info = info

    async def info(self) -> dict:
        if self._info is None:
            raise EngineError("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
        return self._info

    async def gpu_container_check(self, _image: str) -> str | None:
        return "container exited with code 1: no CUDA-capable device is detected"


async def test_what_the_real_probes_report_is_documented(agent_doc: dict, tmp_path: Path) -> None:
    """NvmlProbe against the stand-in NVML library (an HGX board with a lost GPU and a GPU
    short of two fields, GeForce cards, no driver) and probe_host on this machine."""
    fake_nvml = pytest.importorskip("fake_nvml")  # tests/fake_nvml.py: the stand-in library's helper

    flawed = fake_nvml.FakeGpu(fail={"nvmlDeviceGetMaxPcieLinkGeneration": "NOT_SUPPORTED",
                                     "nvmlDeviceGetPowerManagementLimit": "NOT_SUPPORTED"})
    lost = fake_nvml.FakeGpu(fail={"nvmlDeviceGetHandleByIndex": "GPU_IS_LOST"})
    machines = [
        _probe_fake_nvml(tmp_path, [*fake_nvml.h100_sxm(2), flawed, lost]),
        _probe_fake_nvml(tmp_path, fake_nvml.rtx4090(2)),
        _probe_fake_nvml(tmp_path, [], fail={"nvmlInitWithFlags": "DRIVER_NOT_LOADED"}),
    ]
    assert machines[0]["inventory"]["gpus"][2]["unsupported"] == {"pcie.genMax": "Not Supported",
                                                                  "powerLimitW": "Not Supported"}
    assert "error" in machines[0]["inventory"]["gpus"][3] and machines[2]["inventory"]["available"] is False

    docker_info = {"ServerVersion": "27.3.1", "Version": {"ApiVersion": "1.47"}, "DockerRootDir": str(tmp_path),
                   "Runtimes": {"runc": {}, "nvidia": {}}, "DefaultRuntime": "runc", "CDISpecDirs": []}
    compose = [sys.executable, "-c", "print('v2.29.1')"]
    hosts = [
        await host_probe.probe_host(_Engine(docker_info), compose, toolkit_config=tmp_path / "config.toml"),
        await host_probe.probe_host(_Engine(docker_info), None, gpu_check_image="local/cuda-check:1"),
        await host_probe.probe_host(_Engine(None), None),
    ]
    assert hosts[0]["compose"]["version"] == "2.29.1" and hosts[2]["docker"]["available"] is False

    body_schema = request_schema(agent_doc, "/agent/system-data", "put")
    beat_schema = request_schema(agent_doc, "/agent/heartbeat", "post")
    for machine, host in zip(machines, hosts):
        data = {**healthy_system_data(), "nvml": machine["inventory"], "host": host}
        check(agent_doc, {**build_report(data, Requirements(), 1.5), "reportedAt": wire.iso()}, body_schema)
        check(agent_doc, {"sentAt": wire.iso(), "agentVersion": "0.1.0", "uptimeSeconds": 3.0, "initState": "ready",
                          "fingerprint": None, "gpus": machine["telemetry"], "host": telemetry.host_load("/")},
              beat_schema)

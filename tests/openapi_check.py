"""Shared support for the tests that keep docs/agent-api.yaml and
docs/local-marketplace-api.yaml in step with the code: test_api_docs.py (the stack
and job protocol, the renter API) and test_api_docs_machine.py (the machine reports).

Here: loading the two documents (and the fixtures that hand them to the tests),
following local $refs, strict validation against their schemas, the operations
documented and served, the stand-ins both test modules use, and sample machine
payloads shaped as the code builds them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpuhost_agent.protocol import wire
from gpuhost_agent.inventory import netspeed
from gpuhost_agent.local_marketplace.server import build_app
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store

DOCS = Path(__file__).resolve().parents[1] / "docs"
AGENT_DOC = DOCS / "agent-api.yaml"
LOCAL_DOC = DOCS / "local-marketplace-api.yaml"
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "options", "head", "trace"}
AGENT_PREFIX = "/v1/agent/"


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


def properties(doc: dict, name: str) -> set[str]:
    return set(schema(doc, name)["properties"])


# ---- stand-ins both test modules use ----------------------------------------------

class Outbox:
    def __init__(self) -> None:
        self.reports: list[tuple[str, str, dict]] = []

    dropped = 0

    def put(self, kind: str, target: str, body: dict) -> None:
        self.reports.append((kind, target, body))

    def pending(self) -> int:
        return len(self.reports)


class Schedule:
    def every(self, *_args, **_kwargs) -> None:
        pass


# ---- sample machine payloads ---------------------------------------------------------

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

"""The marketplace's side of the machine reports (docs/agent-api.yaml):
systemData with listing fields and compliance, initState, heartbeats and
GPU usage (usage.py).

The fields the seed names (the Listing's, isCompliant, failedComplianceReason)
and the heartbeat's figures are checked for type here, since they go straight
into Environment and Listing responses. The systemData object itself is the
agent's free-form inventory (env key holders only), bounded by the body size.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from gpuhost_agent.local_marketplace import releases, usage
from gpuhost_agent.local_marketplace.http_errors import json_body, json_error, too_far_ahead
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.protocol import wire_time, wire_values

LISTING_NUMBERS = ("gpuBandwidth", "totalRAM", "networkUploadSpeed", "networkDownloadSpeed")
LISTING_WHOLE = ("totalGPUs", "gpuVRAM", "totalCPUs", "totalStorage")  # integers in the document
LISTING_STRINGS = ("gpuName", "gpuInterconnect", "gpuCUDA", "location")
INIT_STATES = ("starting", "ready", "failed")
PHASE_STATES = ("pending", "running", "done", "failed")
GPU_FIGURES = ("uuid", "utilizationPercent", "memoryUsedBytes", "temperatureC", "powerW")
HOST_NUMBERS = ("load1", "load5", "load15", "cpuPercent")
HOST_WHOLE = ("memoryUsedBytes", "memoryTotalBytes")
GPU_WHOLE = ("utilizationPercent", "memoryUsedBytes", "temperatureC")
INTERCONNECTS = ("NVLink", "PCIe", None)
FINGERPRINT = re.compile(r"[0-9a-f]{16}")


def _number(value: object) -> bool:
    return wire_values.is_number(value) and value >= 0


def system_data_problem(body: Any) -> str | None:
    if not isinstance(body, dict) or not isinstance(body.get("systemData"), dict):
        return "body must be an object with a systemData object"
    if not isinstance(body.get("fingerprint"), str) or not wire_time.is_iso(body.get("reportedAt")):
        return "fingerprint (string) and reportedAt (date-time) are required"
    if not FINGERPRINT.fullmatch(body["fingerprint"]):
        return "fingerprint must be 16 lowercase hex digits"
    if ahead := too_far_ahead("reportedAt", body["reportedAt"]):
        return ahead
    listing = body.get("listing")
    if not isinstance(listing, dict):
        return "listing must be an object with the Listing's hardware fields"
    for key in LISTING_NUMBERS:
        if listing.get(key) is not None and not _number(listing[key]):
            return f"listing.{key} must be a non-negative number or null"
    for key in LISTING_WHOLE:
        if listing.get(key) is not None and wire_values.whole(listing[key]) is None:
            return f"listing.{key} must be a whole number or null"
    for key in LISTING_STRINGS:
        if listing.get(key) is not None and not isinstance(listing[key], str):
            return f"listing.{key} must be a string or null"
    missing = [key for key in (*LISTING_NUMBERS, *LISTING_WHOLE, *LISTING_STRINGS) if key not in listing]
    if missing:
        return f"listing must have {', '.join(missing)} (null when not measured)"
    if listing.get("gpuInterconnect") not in INTERCONNECTS:
        return "listing.gpuInterconnect must be NVLink, PCIe or null"
    if wire_values.whole(listing.get("totalGPUs")) is None:
        return "listing.totalGPUs must be a whole number"
    listing["totalGPUs"] = wire_values.whole(listing["totalGPUs"])
    compliance = body.get("compliance")
    if (
        not isinstance(compliance, dict)
        or not isinstance(compliance.get("isCompliant"), bool)
        or not isinstance(compliance.get("failedComplianceReason"), str)
    ):
        return "compliance must be an object with isCompliant (boolean) and failedComplianceReason (string)"
    checks = compliance.get("checks")
    if not isinstance(checks, list) or not all(
        isinstance(c, dict)
        and isinstance(c.get("id"), str)
        and isinstance(c.get("ok"), bool)
        and isinstance(c.get("summary"), str)
        and isinstance(c.get("remedy"), str)
        and isinstance(c.get("skipped", False), bool)  # optional: older agents leave it out
        for c in checks
    ):
        return "compliance.checks must be an array of {id, ok, summary, remedy} (and skipped, a boolean, if given)"
    if not compliance["isCompliant"] and not compliance["failedComplianceReason"]:
        return "failedComplianceReason is required when isCompliant is false"
    return None


def init_state_problem(body: Any) -> str | None:
    if not isinstance(body, dict) or body.get("state") not in INIT_STATES:
        return f"body must be an object with state one of {', '.join(INIT_STATES)}"
    if not isinstance(body.get("phases"), list) or not wire_time.is_iso(body.get("updatedAt")):
        return "phases (array) and updatedAt (date-time) are required"
    if ahead := too_far_ahead("updatedAt", body["updatedAt"]):
        return ahead
    for key in ("phase", "error"):
        if key not in body or (body[key] is not None and not isinstance(body[key], str)):
            return f"{key} is required: a string or null"
    for index, phase in enumerate(body["phases"]):
        if not _is_phase(phase):
            return f"phases[{index}] must be {{name, state ({', '.join(PHASE_STATES)}), startedAt, finishedAt, detail}}"
    return None


def _is_phase(phase: Any) -> bool:
    return (
        isinstance(phase, dict)
        and isinstance(phase.get("name"), str)
        and phase.get("state") in PHASE_STATES
        and all(
            key in phase and (phase[key] is None or wire_time.is_iso(phase[key])) for key in ("startedAt", "finishedAt")
        )
        and "detail" in phase
        and (phase["detail"] is None or isinstance(phase["detail"], str))
    )


def _host_problem(host: dict) -> str | None:
    """The live load, as HeartbeatHost says: every figure, a number (whole
    for bytes; only the free disk may be unknown)."""
    for key in (*HOST_NUMBERS, *HOST_WHOLE, "diskFreeBytes"):
        if key not in host:
            return f"host.{key} is required"
        value = host[key]
        if key == "diskFreeBytes" and value is None:
            continue
        if not _number(value) or (key in HOST_WHOLE or key == "diskFreeBytes") and wire_values.whole(value) is None:
            return f"host.{key} must be a non-negative {'whole ' if key in HOST_WHOLE else ''}number"
    return None


def heartbeat_problem(body: Any) -> str | None:
    if not isinstance(body, dict) or not wire_time.is_iso(body.get("sentAt")):
        return "body must be an object with sentAt (date-time)"
    host, gpus = body.get("host"), body.get("gpus")
    if not isinstance(host, dict) or not isinstance(gpus, list):
        return "host (object) and gpus (array) are required"
    if not isinstance(body.get("agentVersion"), str) or body.get("initState") not in INIT_STATES:
        return f"agentVersion (string) and initState (one of {', '.join(INIT_STATES)}) are required"
    if not _number(body.get("uptimeSeconds")):
        return "uptimeSeconds must be a non-negative number"
    if "fingerprint" not in body or (body["fingerprint"] is not None and not isinstance(body["fingerprint"], str)):
        return "fingerprint is required: the last systemData's, or null before the first"
    reports = body.get("reports", {"pending": 0, "dropped": 0})
    if not isinstance(reports, dict) or any(
        wire_values.whole(reports.get(key)) is None for key in ("pending", "dropped")
    ):
        return "reports must be an object with pending and dropped, whole numbers"
    if problem := _host_problem(host):
        return problem
    for index, gpu in enumerate(gpus):
        if problem := _gpu_problem(gpu):
            return f"gpus[{index}]{problem}"
    if problem := _machines_problem(body.get("machines", {})):
        return problem
    if "upgrade" in body and (problem := releases.upgrade_problem(body["upgrade"])):
        return problem
    return _gpu_assignments_problem(body["gpuAssignments"]) if "gpuAssignments" in body else None


def _machines_problem(machines: Any) -> str | None:
    """A Swarm leader's `machines`: per node id, its GPUs' figures or why none."""
    if not isinstance(machines, dict):
        return "machines must be an object of node ids"
    for node, machine in machines.items():
        if not isinstance(machine, dict) or ("gpus" in machine) == ("error" in machine):
            return f"machines.{node} must be an object with gpus (array) or error (string)"
        if "error" in machine and not isinstance(machine["error"], str):
            return f"machines.{node}.error must be a string"
        if "gpus" in machine and not isinstance(machine["gpus"], list):
            return f"machines.{node}.gpus must be an array"
        for index, gpu in enumerate(machine.get("gpus") or []):
            if problem := _gpu_problem(gpu):
                return f"machines.{node}.gpus[{index}]{problem}"
    return None


def _gpu_problem(gpu: Any) -> str | None:
    """One GPU's figures (HeartbeatGpu), or NVML's error for one it cannot read."""
    if not isinstance(gpu, dict) or wire_values.whole(gpu.get("index")) is None:
        return " must be an object with an index"
    if "error" in gpu:
        return None if isinstance(gpu["error"], str) else ".error must be NVML's error text"
    if not all(key in gpu for key in GPU_FIGURES):
        return f" must have {', '.join(GPU_FIGURES)} (null when unknown), or an error"
    if gpu["uuid"] is not None and not isinstance(gpu["uuid"], str):
        return ".uuid must be a string or null"
    for key in GPU_FIGURES[1:]:
        if gpu[key] is not None and not _number(gpu[key]):
            return f".{key} must be a non-negative number or null"
        if key in GPU_WHOLE and gpu[key] is not None and wire_values.whole(gpu[key]) is None:
            return f".{key} must be a whole number or null"
    if (gpu["utilizationPercent"] or 0) > 100:
        return ".utilizationPercent must be from 0 to 100"
    return None


def _gpu_assignments_problem(states: Any) -> str | None:
    """Optional (added later): lists of GPU UUIDs, and rental id -> UUIDs."""
    if not isinstance(states, dict):
        return "gpuAssignments must be an object"
    for key in ("free", "outOfService"):
        if not _strings(states.get(key, [])):
            return f"gpuAssignments.{key} must be an array of GPU UUIDs"
    for key in ("assigned", "releasing"):
        by_rental = states.get(key, {})
        if not isinstance(by_rental, dict) or not all(_strings(uuids) for uuids in by_rental.values()):
            return f"gpuAssignments.{key} must map rental ids to arrays of GPU UUIDs"
    return None


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def routes(state: MarketplaceState) -> list[web.RouteDef]:
    async def put_system_data(request: web.Request) -> web.Response:
        body = await json_body(request)
        problem = system_data_problem(body)
        if problem:
            return json_error(400, problem)
        accepted = state.accept_system_data(body)
        return web.json_response({"accepted": accepted, "fingerprint": body["fingerprint"]})

    async def put_init_state(request: web.Request) -> web.Response:
        body = await json_body(request)
        problem = init_state_problem(body)
        if problem:
            return json_error(400, problem)
        return web.json_response({"accepted": state.accept_init_state(body)})

    async def heartbeat(request: web.Request) -> web.Response:
        body = await json_body(request)
        problem = heartbeat_problem(body)
        if problem:
            return json_error(400, problem)
        return web.json_response(state.accept_heartbeat(body))

    async def put_usage(request: web.Request) -> web.Response:
        body = await json_body(request)
        problem = usage.report_problem(body)
        if problem is None:
            problem = too_far_ahead("slotStart", body["slotStart"])
        if problem:
            return json_error(400, problem)
        state.store.rental(body["rentalId"])  # 404 for a rental this marketplace never had
        key = usage.record_key(body)
        state.store.usage[key] = usage.merge(state.store.usage.get(key, {}), body)
        state.changed()
        return web.json_response({"accepted": True})

    return [
        web.put("/v1/agent/usage", put_usage),
        web.put("/v1/agent/system-data", put_system_data),
        web.put("/v1/agent/init-state", put_init_state),
        web.post("/v1/agent/heartbeat", heartbeat),
    ]

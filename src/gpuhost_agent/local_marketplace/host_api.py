"""The marketplace's side of the machine reports (docs/agent-api.yaml):
systemData with listing fields and compliance, initState, heartbeats and
GPU usage (usage.py).

The fields the seed names (the Listing's, isCompliant, failedComplianceReason)
and the heartbeat's figures are checked for type here, since they go straight
into Environment and Listing responses. The systemData object itself is the
agent's free-form inventory (env key holders only), bounded by the body size.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gpuhost_agent.local_marketplace import usage
from gpuhost_agent.local_marketplace.http_errors import json_body, json_error, too_far_ahead
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.protocol import wire

LISTING_NUMBERS = (
    "totalGPUs",
    "gpuVRAM",
    "gpuBandwidth",
    "totalCPUs",
    "totalRAM",
    "totalStorage",
    "networkUploadSpeed",
    "networkDownloadSpeed",
)
LISTING_STRINGS = ("gpuName", "gpuInterconnect", "gpuCUDA", "location")
INIT_STATES = ("starting", "ready", "failed")


def _number(value: object) -> bool:
    return wire.is_number(value) and value >= 0


def system_data_problem(body: Any) -> str | None:
    if not isinstance(body, dict) or not isinstance(body.get("systemData"), dict):
        return "body must be an object with a systemData object"
    if not isinstance(body.get("fingerprint"), str) or not wire.is_iso(body.get("reportedAt")):
        return "fingerprint (string) and reportedAt (date-time) are required"
    if ahead := too_far_ahead("reportedAt", body["reportedAt"]):
        return ahead
    listing = body.get("listing")
    if not isinstance(listing, dict):
        return "listing must be an object with the Listing's hardware fields"
    for key in LISTING_NUMBERS:
        if listing.get(key) is not None and not _number(listing[key]):
            return f"listing.{key} must be a non-negative number or null"
    for key in LISTING_STRINGS:
        if listing.get(key) is not None and not isinstance(listing[key], str):
            return f"listing.{key} must be a string or null"
    if not isinstance(listing.get("totalGPUs"), int):
        return "listing.totalGPUs must be an integer"
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
        and isinstance(c.get("remedy", ""), str)
        for c in checks
    ):
        return "compliance.checks must be an array of {id, ok, summary, remedy}"
    if not compliance["isCompliant"] and not compliance["failedComplianceReason"]:
        return "failedComplianceReason is required when isCompliant is false"
    return None


def init_state_problem(body: Any) -> str | None:
    if not isinstance(body, dict) or body.get("state") not in INIT_STATES:
        return f"body must be an object with state one of {', '.join(INIT_STATES)}"
    if not isinstance(body.get("phases"), list) or not wire.is_iso(body.get("updatedAt")):
        return "phases (array) and updatedAt (date-time) are required"
    if ahead := too_far_ahead("updatedAt", body["updatedAt"]):
        return ahead
    if body.get("error") is not None and not isinstance(body["error"], str):
        return "error must be a string or null"
    return None


def heartbeat_problem(body: Any) -> str | None:
    if not isinstance(body, dict) or not wire.is_iso(body.get("sentAt")):
        return "body must be an object with sentAt (date-time)"
    host, gpus = body.get("host"), body.get("gpus")
    if not isinstance(host, dict) or not isinstance(gpus, list):
        return "host (object) and gpus (array) are required"
    for key, value in host.items():
        if value is not None and not _number(value):
            return f"host.{key} must be a non-negative number or null"
    for index, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            return f"gpus[{index}] must be an object"
        for key, value in gpu.items():
            if key in ("uuid", "error"):
                if value is not None and not isinstance(value, str):
                    return f"gpus[{index}].{key} must be a string or null"
            elif value is not None and not _number(value):
                return f"gpus[{index}].{key} must be a non-negative number or null"
    return _gpu_assignments_problem(body.get("gpuAssignments"))


def _gpu_assignments_problem(states: Any) -> str | None:
    """Optional (added later): lists of GPU UUIDs, and rental id -> UUIDs."""
    if states is None:
        return None
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

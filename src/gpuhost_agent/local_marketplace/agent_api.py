"""The marketplace's side of the agent protocol (docs/agent-api.yaml), under /v1/agent."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gpuhost_agent.local_marketplace import releases, ssh_keys
from gpuhost_agent.local_marketplace.http_errors import json_body, json_error, too_far_ahead
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.protocol import wire, wire_time, wire_values

MAX_POLL_WAIT = wire.MAX_POLL_WAIT_SECONDS
MAX_POLL_JOBS = 100
MAX_CAPABILITIES = 32


SESSION_SUPERSEDED = "session-superseded"


def superseded(session: str) -> str:
    return (
        f"session {session[:64]} was superseded: an agent opened a newer session with this environment's key; "
        "open a new session (if another agent uses this key, stop one of them)"
    )


def routes(state: MarketplaceState) -> list[web.RouteDef]:
    store = state.store

    async def open_session(request: web.Request) -> web.Response:
        body = await json_body(request)
        if not isinstance(body, dict):
            return json_error(400, "body must be an object describing the agent")
        for key in ("sshHostKey", "sshHostKeyFingerprint", "agentVersion", "hostname"):
            if key in body and not isinstance(body[key], str):
                return json_error(400, f"{key} must be a string")
        if "startedAt" in body and not wire_time.is_iso(body["startedAt"]):
            return json_error(400, "startedAt must be an ISO 8601 date-time")
        capabilities = body.get("capabilities", [])
        if (
            not isinstance(capabilities, list)
            or len(capabilities) > MAX_CAPABILITIES
            or not all(isinstance(item, str) and 0 < len(item) <= 64 for item in capabilities)
        ):
            return json_error(400, f"capabilities must be an array of at most {MAX_CAPABILITIES} short names")
        problem = releases.upgrade_problem(body["upgrade"]) if "upgrade" in body else None
        if problem:
            return json_error(400, problem)
        session_id, requeued = state.new_session()
        store.host["sshHostKey"] = ssh_keys.host_key(body.get("sshHostKey"))
        store.host["agentUpgrade"] = body.get("upgrade")
        state.changed()
        reply = {
            "sessionId": session_id,
            "envId": store.envId,
            "serverTime": wire_time.iso(),
            "requeuedJobs": requeued,
            "intervals": state.intervals,
            "requirements": state.requirements,
        }
        if state.release is not None:
            reply["agentRelease"] = state.release.offer(state.release_key())
        return web.json_response(reply)

    async def poll_jobs(request: web.Request) -> web.Response:
        try:
            wait = float(request.query.get("wait", "0"))
            max_jobs = int(request.query.get("max", "16"))
        except ValueError:
            wait = max_jobs = -1
        if not 0 <= wait <= MAX_POLL_WAIT or not 1 <= max_jobs <= MAX_POLL_JOBS:  # NaN fails too
            return json_error(
                400, f"wait must be from 0 to {MAX_POLL_WAIT} seconds, and max an integer from 1 to {MAX_POLL_JOBS}"
            )
        session = request.headers.get(wire.SESSION_HEADER)
        if session and state.session_id and session != state.session_id:
            return json_error(409, superseded(session), code=SESSION_SUPERSEDED)
        transport = request.transport
        jobs = await state.wait_for_jobs(
            wait,
            max_jobs,
            request.headers.get(wire.SESSION_HEADER),
            lambda: transport is not None and not transport.is_closing(),
        )
        if session and state.session_id and session != state.session_id:  # superseded while it waited
            return json_error(409, superseded(session), code=SESSION_SUPERSEDED)
        return web.json_response({"jobs": [store.job_payload(job) for job in jobs]})

    async def complete_job(request: web.Request) -> web.Response:
        body = await json_body(request)
        if not isinstance(body, dict) or body.get("outcome") not in (wire.OUTCOME_SUCCEEDED, wire.OUTCOME_FAILED):
            return json_error(400, "body must be an object with outcome 'succeeded' or 'failed'")
        job = store.complete_job(request.match_info["jobId"], body["outcome"], body.get("errorMsg"))
        state.changed()
        return web.json_response({"jobId": job.jobId, "state": job.state, "outcome": job.outcome})

    async def put_status(request: web.Request) -> web.Response:
        body = await json_body(request)
        problem = _status_problem(body)
        if problem:
            return json_error(400, problem)
        accepted = store.apply_status(request.match_info["stackId"], body)
        state.changed()
        return web.json_response({"stackId": request.match_info["stackId"], "accepted": accepted})

    async def put_containers(request: web.Request) -> web.Response:
        body = await json_body(request)
        problem = _containers_problem(body)
        if problem:
            return json_error(400, problem)
        accepted = store.apply_containers(request.match_info["stackId"], body["containers"], body["observedAt"])
        state.changed()
        return web.json_response({"stackId": request.match_info["stackId"], "accepted": accepted})

    async def rental_ssh_keys(request: web.Request) -> web.Response:
        """The keys that may log in to the rental's containers now: its
        renter's, while the rental is active; none once it ended."""
        rental_id = request.match_info["rentalId"]
        rental = store.rentals.get(rental_id)
        if rental is None:
            return json_error(404, f"rental {rental_id[:128]} not found")
        active = rental["status"] == wire.RENTAL_ACTIVE
        return web.json_response({"rentalId": rental_id, "keys": ssh_keys.login_keys(store.sshKeys) if active else []})

    async def desired_state(_request: web.Request) -> web.Response:
        state.expire_rentals()
        return web.json_response(store.desired_state())

    return [
        web.post("/v1/agent/sessions", open_session),
        web.get("/v1/agent/desired-state", desired_state),
        web.get("/v1/agent/rentals/{rentalId}/ssh-keys", rental_ssh_keys),
        web.get("/v1/agent/jobs", poll_jobs),
        web.post("/v1/agent/jobs/{jobId}/complete", complete_job),
        web.put("/v1/agent/stacks/{stackId}/status", put_status),
        web.put("/v1/agent/stacks/{stackId}/containers", put_containers),
    ]


def _status_problem(body: Any) -> str | None:
    """What is wrong with a status report, if anything. Every field is checked:
    whatever passes is shown to renters as it is."""
    if not isinstance(body, dict):
        return "body must be an object"
    if body.get("status") not in wire.REPORTED_STATUSES:
        return f"status must be one of {', '.join(wire.REPORTED_STATUSES)}"
    if not wire_time.is_iso(body.get("reportedAt")):
        return "reportedAt must be an ISO 8601 date-time"
    if ahead := too_far_ahead("reportedAt", body["reportedAt"]):
        return ahead
    for key in ("errorMsg", "pStackName", "jobId"):
        if key in body and not isinstance(body[key], str):
            return f"{key} must be a string"
    if body["status"] == wire.ERROR and not body.get("errorMsg"):
        return "errorMsg is required with status ERROR"
    gpus = body.get("assignedGPUs", [])
    if not isinstance(gpus, list) or not all(isinstance(uuid, str) for uuid in gpus):
        return "assignedGPUs must be an array of GPU UUIDs"
    if wire_values.whole(body.get("pStackId", 0), 2**31 - 1) is None:
        return "pStackId must be an integer from 0 to 2^31-1"
    return None


def _containers_problem(body: Any) -> str | None:
    if not isinstance(body, dict) or not isinstance(body.get("containers"), list):
        return "body must be an object with a containers array"
    if not wire_time.is_iso(body.get("observedAt")):
        return "observedAt must be an ISO 8601 date-time"
    if ahead := too_far_ahead("observedAt", body["observedAt"]):
        return ahead
    for index, container in enumerate(body["containers"]):
        if not isinstance(container, dict):
            return f"containers[{index}] must be an object"
        for key, kind in (
            ("Name", str),
            ("Id", str),
            ("State", str),
            ("Created", int),
            ("Labels", list),
            ("Ports", list),
        ):
            if not isinstance(container.get(key), kind) or isinstance(container.get(key), bool):
                wanted = "a string" if kind is str else "an integer" if kind is int else "an array"
                return f"containers[{index}].{key} must be {wanted}"
        if not all(isinstance(label, str) for label in container["Labels"]):
            return f"containers[{index}].Labels must be strings"
        for port in container["Ports"]:
            if problem := _port_problem(port):
                return f"containers[{index}].Ports: {problem}"
    return None


def _port_problem(port: Any) -> str | None:
    """ContainerPort: PrivatePort and Type always; IP and PublicPort together, for a published port."""
    if not isinstance(port, dict) or not isinstance(port.get("Type"), str):
        return "each must have PrivatePort (integer) and Type (string)"
    if wire_values.whole(port.get("PrivatePort")) is None:
        return "each must have PrivatePort (integer) and Type (string)"
    if ("IP" in port) != ("PublicPort" in port):
        return "IP and PublicPort come together"
    if "IP" in port and (not isinstance(port["IP"], str) or wire_values.whole(port["PublicPort"]) is None):
        return "IP must be a string and PublicPort an integer"
    return None

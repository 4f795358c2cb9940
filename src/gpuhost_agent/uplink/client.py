"""The agent's side of the agent protocol (docs/agent-api.yaml), over aiohttp.

Every request has an explicit timeout. Errors are sorted into two kinds the
callers act on differently: Unavailable (try again later, maybe after
Retry-After) and Rejected (the marketplace said no; retrying will not help);
both, and how a reply is read, are in replies.py.
"""

from __future__ import annotations

import random
import time
from typing import Any, cast

import aiohttp

from gpuhost_agent.protocol import wire
from gpuhost_agent.protocol.wire_replies import HeartbeatReply, SessionReply
from gpuhost_agent.uplink.replies import (
    MarketplaceAuthFailed,
    MarketplaceRejected,
    MarketplaceUnavailable,
    ReplyTooLarge,
    decode_json,
    error_message,
    parse_retry_after,
    read_capped,
)
from gpuhost_agent.uplink.reports import CONTAINERS, INIT_STATE, JOB_COMPLETE, STATUS, SYSTEM_DATA, USAGE, Report

# The largest reply the agent reads into memory. One job always fits (its Compose
# file is at most wire_jobs.MAX_CONTENT_BYTES, a few MiB even fully escaped); a list of
# many large ones may not, and poll_jobs then asks for one job at a time.
MAX_BODY_BYTES = 8 * 1024 * 1024
# After a job list over the cap, poll for one job at a time for longer than the
# marketplace's delivery lease (600 s): the jobs of the lost reply are redelivered
# within it, and must not come back as the same oversized batch.
_SINGLE_JOB_SECONDS = 900.0


class MarketplaceClient:
    def __init__(
        self, base_url: str, api_key: str, *, request_timeout: float = 15, max_body_bytes: int = MAX_BODY_BYTES
    ):
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._request_timeout = request_timeout
        self._max_body_bytes = max_body_bytes
        self._single_jobs_until = 0.0  # monotonic time; see _SINGLE_JOB_SECONDS
        self._http: aiohttp.ClientSession | None = None
        self.session_id: str | None = None

    async def __aenter__(self) -> MarketplaceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(headers={wire.API_KEY_HEADER: self._api_key})
        return self._http

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict | None = None,
        timeout: float | None = None,
        raw_up_to: int | None = None,
    ) -> Any:
        """One call. Returns the decoded JSON (or the text of a non-JSON reply);
        raises only MarketplaceUnavailable or MarketplaceRejected, also for a
        reply the agent cannot read (malformed JSON, larger than the cap), so
        that no bad reply can kill the loop that made the call."""
        headers = {wire.SESSION_HEADER: self.session_id} if self.session_id else {}
        try:
            async with self._session().request(
                method,
                f"{self.base_url}{path}",
                json=body,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout or self._request_timeout),
                allow_redirects=False,  # the key and session go to the marketplace's URL, never where a reply points
            ) as response:
                if 300 <= response.status < 400:
                    where = str(response.headers.get("Location", ""))[:200]
                    raise MarketplaceRejected(
                        response.status,
                        f"{method} {path} answered a redirect to {where!r}: the agent follows none (its key would go "
                        "with it); set GPUHOST_MARKETPLACE_URL to the address the marketplace really answers on",
                    )
                if response.status == 429 or response.status >= 500:
                    raise MarketplaceUnavailable(
                        f"{method} {path}: HTTP {response.status}",
                        parse_retry_after(response.headers.get("Retry-After")),
                    )
                if response.status in (401, 403):
                    raise MarketplaceAuthFailed(
                        f"{method} {path}: HTTP {response.status} {await error_message(response)}"
                        " (check the environment id and API key in the agent's configuration)"
                    )
                if response.status >= 400:
                    raise MarketplaceRejected(response.status, await error_message(response))
                raw = await read_capped(response, raw_up_to or self._max_body_bytes, f"{method} {path}")
                if raw_up_to is not None:
                    return raw
                if response.content_type == "application/json":
                    return decode_json(raw, response.status, f"{method} {path}")
                return raw.decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise MarketplaceUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    async def open_session(self, info: dict) -> SessionReply:
        reply = await self._request("POST", "/agent/sessions", body=info)
        if not isinstance(reply, dict):
            raise MarketplaceRejected(200, "POST /agent/sessions answered without a JSON object")
        self.session_id = reply.get("sessionId")
        return cast(SessionReply, reply)

    async def download(self, path: str, size: int, timeout: float = 300) -> bytes:
        """A file the marketplace serves under its own base URL (an agent
        release), at most `size` bytes."""
        got = await self._request("GET", path, timeout=timeout, raw_up_to=size)
        assert isinstance(got, bytes)
        return got

    async def poll_jobs(self, wait_seconds: float, max_jobs: int = 16) -> list:
        """The raw jobs of one long poll. Only the reply's shape is checked here;
        each job is decoded (and a bad one refused and reported) by the
        dispatcher, so one bad job does not cost the others."""
        if time.monotonic() < self._single_jobs_until:
            max_jobs = 1
        wait_seconds = max(0, min(int(wait_seconds), wire.MAX_POLL_WAIT_SECONDS))  # a longer wait is refused (400)
        try:
            reply = await self._request(
                "GET",
                "/agent/jobs",
                params={"wait": str(wait_seconds), "max": str(max_jobs)},
                timeout=wait_seconds + self._request_timeout,
            )
        except ReplyTooLarge:
            # Many large templates at once can pass the cap, one job alone cannot:
            # ask for one at a time until the lost reply's jobs have come back.
            self._single_jobs_until = time.monotonic() + _SINGLE_JOB_SECONDS
            raise
        if not isinstance(reply, dict):
            raise MarketplaceRejected(200, "GET /agent/jobs answered without a JSON object")
        jobs = reply.get("jobs")
        if not isinstance(jobs, list):
            raise MarketplaceRejected(200, "GET /agent/jobs answered without a jobs array")
        return jobs

    async def complete_job(self, job_id: str, body: dict) -> None:
        await self._request("POST", f"/agent/jobs/{job_id}/complete", body=body)

    async def put_stack_status(self, stack_id: str, body: dict) -> None:
        await self._request("PUT", f"/agent/stacks/{stack_id}/status", body=body)

    async def put_containers(self, stack_id: str, body: dict) -> None:
        await self._request("PUT", f"/agent/stacks/{stack_id}/containers", body=body)

    async def put_system_data(self, body: dict) -> None:
        await self._request("PUT", "/agent/system-data", body=body)

    async def put_init_state(self, body: dict) -> None:
        await self._request("PUT", "/agent/init-state", body=body)

    async def put_usage(self, body: dict) -> None:
        await self._request("PUT", "/agent/usage", body=body)

    async def desired_state(self) -> Any:
        """What the marketplace wants on this machine: every stack with its
        template, every rental with its end (docs/agent-api.yaml). Decoded by
        core.desired_state, which refuses what does not have the shape."""
        return await self._request("GET", "/agent/desired-state")

    async def rental_ssh_keys(self, rental_id: str) -> list[str]:
        """The OpenSSH public keys that may log in to the rental's containers
        now (its renter's User.sshKeys); an ended rental has none."""
        reply = await self._request("GET", f"/agent/rentals/{rental_id}/ssh-keys", timeout=10)
        keys = reply.get("keys") if isinstance(reply, dict) else None
        if not isinstance(keys, list):
            raise MarketplaceRejected(200, "GET /agent/rentals/{id}/ssh-keys answered without a keys array")
        return [key for key in keys if isinstance(key, str)]

    async def heartbeat(self, body: dict) -> HeartbeatReply:
        reply = await self._request("POST", "/agent/heartbeat", body=body)
        return cast(HeartbeatReply, reply if isinstance(reply, dict) else {})

    def stats(self) -> dict:
        return {"marketplace": self.base_url, "sessionId": self.session_id}

    async def send_report(self, report: Report) -> None:
        """The outbox's sender: one report kind, one protocol call."""
        if report.kind == STATUS:
            await self.put_stack_status(report.target, report.body)
        elif report.kind == CONTAINERS:
            await self.put_containers(report.target, report.body)
        elif report.kind == JOB_COMPLETE:
            await self.complete_job(report.target, report.body)
        elif report.kind == SYSTEM_DATA:
            await self.put_system_data(report.body)
        elif report.kind == INIT_STATE:
            await self.put_init_state(report.body)
        elif report.kind == USAGE:
            await self.put_usage(report.body)
        else:
            raise ValueError(f"unknown report kind {report.kind!r}")

    def auth_headers(self) -> dict[str, str]:
        """What every agent call carries (key, and the session once open), for
        connections made outside this client: the stream channel's WebSockets."""
        headers = {wire.API_KEY_HEADER: self._api_key}
        if self.session_id:
            headers[wire.SESSION_HEADER] = self.session_id
        return headers

    def http(self) -> aiohttp.ClientSession:
        """The authenticated HTTP session, for the network speed test's streams."""
        return self._session()


MAX_RETRY_AFTER = 600.0


def retry_delay(failures: int, exc: BaseException | None = None, *, base: float = 0.5, ceiling: float = 30.0) -> float:
    """Seconds to wait before trying the marketplace again: its Retry-After when
    it gave one, else exponential backoff with jitter (half to full of the step),
    so that many agents coming back after an outage do not arrive in step."""
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:  # honoured, but a marketplace cannot park the agent for a day
        return min(retry_after, MAX_RETRY_AFTER)
    top = min(ceiling, base * 2 ** min(failures, 16))
    return random.uniform(top / 2, top)

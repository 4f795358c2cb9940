"""The agent's side of the agent protocol (docs/agent-api.yaml), over aiohttp.

Every request has an explicit timeout. Errors are sorted into two kinds the
callers act on differently: Unavailable (try again later, maybe after
Retry-After) and Rejected (the marketplace said no; retrying will not help).
"""

from __future__ import annotations

import random
from typing import Any

import aiohttp

from . import wire


class MarketplaceUnavailable(RuntimeError):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class MarketplaceAuthFailed(MarketplaceUnavailable):
    """401/403: the key is wrong, expired or rotated. Retried like an outage, so
    that no report is lost while an operator fixes the configuration."""


class MarketplaceRejected(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


class MarketplaceClient:
    def __init__(self, base_url: str, api_key: str, *, request_timeout: float = 15):
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._request_timeout = request_timeout
        self._http: aiohttp.ClientSession | None = None
        self.session_id: str | None = None

    async def __aenter__(self) -> "MarketplaceClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(headers={wire.API_KEY_HEADER: self._api_key})
        return self._http

    async def _request(self, method: str, path: str, *, body: Any = None, params: dict | None = None, timeout: float | None = None) -> Any:
        headers = {wire.SESSION_HEADER: self.session_id} if self.session_id else {}
        try:
            async with self._session().request(
                method, f"{self.base_url}{path}", json=body, params=params, headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout or self._request_timeout),
            ) as response:
                if response.status == 429 or response.status >= 500:
                    raise MarketplaceUnavailable(
                        f"{method} {path}: HTTP {response.status}", _retry_after(response.headers.get("Retry-After"))
                    )
                if response.status in (401, 403):
                    raise MarketplaceAuthFailed(
                        f"{method} {path}: HTTP {response.status} {await _error_message(response)}"
                        " (check the environment id and API key in the agent's configuration)")
                if response.status >= 400:
                    raise MarketplaceRejected(response.status, await _error_message(response))
                if response.content_type == "application/json":
                    return await response.json()
                return await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise MarketplaceUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    async def open_session(self, info: dict) -> dict:
        reply = await self._request("POST", "/agent/sessions", body=info)
        if not isinstance(reply, dict):
            raise MarketplaceRejected(200, "POST /agent/sessions answered without a JSON object")
        self.session_id = reply.get("sessionId")
        return reply

    async def poll_jobs(self, wait_seconds: float, max_jobs: int = 16) -> list:
        reply = await self._request(
            "GET", "/agent/jobs", params={"wait": str(int(wait_seconds)), "max": str(max_jobs)},
            timeout=wait_seconds + self._request_timeout,
        )
        jobs = reply.get("jobs") if isinstance(reply, dict) else None
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

    async def heartbeat(self, body: dict) -> dict:
        reply = await self._request("POST", "/agent/heartbeat", body=body)
        return reply if isinstance(reply, dict) else {}

    def http(self) -> aiohttp.ClientSession:
        """The authenticated HTTP session, for the network speed test's streams."""
        return self._session()


def retry_delay(failures: int, exc: BaseException | None = None, *, base: float = 0.5, ceiling: float = 30.0) -> float:
    """Seconds to wait before trying the marketplace again: its Retry-After when
    it gave one, else exponential backoff with jitter (half to full of the step),
    so that many agents coming back after an outage do not arrive in step."""
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        return retry_after
    top = min(ceiling, base * 2 ** min(failures, 16))
    return random.uniform(top / 2, top)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


async def _error_message(response: aiohttp.ClientResponse) -> str:
    try:
        body = await response.json(content_type=None)
        if isinstance(body, dict) and "message" in body:
            return str(body["message"])
    except (ValueError, aiohttp.ContentTypeError):
        pass
    return response.reason or "request refused"

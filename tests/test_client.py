"""The protocol client against a misbehaving marketplace (a real HTTP server)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from gpuhost_agent.agent import send_report
from gpuhost_agent.client import MarketplaceAuthFailed, MarketplaceClient, MarketplaceRejected, MarketplaceUnavailable
from gpuhost_agent.outbox import STATUS, Outbox


@pytest.fixture
async def flaky():
    """Answers from a script: each path pops its next (status, body, headers)."""
    script: dict[str, list] = {}
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        status, body, headers = script[request.path].pop(0)
        return web.json_response(body, status=status, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = MarketplaceClient(f"http://127.0.0.1:{runner.addresses[0][1]}/v1", "key", request_timeout=5)
    yield client, script, seen
    await client.close()
    await runner.cleanup()


async def test_errors_are_sorted_for_the_caller(flaky):
    client, script, _ = flaky
    script["/v1/agent/sessions"] = [(503, {"message": "busy"}, {"Retry-After": "0.2"}), (401, {"message": "bad key"}, {}),
                                    (200, ["not", "an", "object"], {}), (200, {"sessionId": "s1"}, {})]
    with pytest.raises(MarketplaceUnavailable) as busy:
        await client.open_session({})
    assert busy.value.retry_after == 0.2
    with pytest.raises(MarketplaceAuthFailed, match="bad key"):
        await client.open_session({})
    with pytest.raises(MarketplaceRejected, match="JSON object"):
        await client.open_session({})
    assert (await client.open_session({}))["sessionId"] == "s1" and client.session_id == "s1"


async def test_a_report_refused_for_the_key_is_retried_not_dropped(flaky):
    client, script, seen = flaky
    script["/v1/agent/stacks/s1/status"] = [(401, {"message": "key rotated"}, {}), (200, {"accepted": True}, {})]
    outbox = Outbox(lambda report: send_report(client, report), base_delay=0.01)
    outbox.put(STATUS, "s1", {"status": "APPLIED"})
    runner = asyncio.create_task(outbox.run())
    assert await outbox.drained(5)
    runner.cancel()
    assert seen == ["PUT /v1/agent/stacks/s1/status"] * 2 and outbox.dropped == 0 and outbox.sent == 1

"""The protocol client against a misbehaving marketplace (a real HTTP server)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from support.fakes import FastAsyncio

from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink import outbox as outbox_module
from gpuhost_agent.uplink.client import MAX_RETRY_AFTER, MarketplaceClient, retry_delay
from gpuhost_agent.uplink.outbox import STATUS, Outbox
from gpuhost_agent.uplink.replies import MarketplaceAuthFailed, MarketplaceRejected, MarketplaceUnavailable


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
    script["/v1/agent/sessions"] = [
        (503, {"message": "busy"}, {"Retry-After": "0.2"}),
        (401, {"message": "bad key"}, {}),
        (200, ["not", "an", "object"], {}),
        (200, {"sessionId": "s1"}, {}),
    ]
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
    outbox = Outbox(client.send_report, AgentDB(None), base_delay=0.01)
    outbox.put(STATUS, "s1", {"status": "APPLIED"})
    runner = asyncio.create_task(outbox.run())
    assert await outbox.drained(5)
    runner.cancel()
    assert seen == ["PUT /v1/agent/stacks/s1/status"] * 2 and outbox.rejected == 0 and outbox.sent == 1


# ---- Retry-After has a cap ------------------------------------------------------------------


@pytest.mark.parametrize(
    "retry_after, waited",
    [
        (0.2, 0.2),
        (599.0, 599.0),
        (MAX_RETRY_AFTER, MAX_RETRY_AFTER),  # honoured as given
        (600.5, MAX_RETRY_AFTER),
        (86400.0, MAX_RETRY_AFTER),
        (1e12, MAX_RETRY_AFTER),
        (float("inf"), MAX_RETRY_AFTER),
    ],
)
def test_retry_after_is_honoured_up_to_the_cap(retry_after, waited):
    """A marketplace cannot park the agent for a day: whatever its Retry-After,
    the agent waits at most MAX_RETRY_AFTER (10 minutes) before trying again."""
    assert MAX_RETRY_AFTER == 600.0
    for failures in (1, 5, 30):
        assert retry_delay(failures, MarketplaceUnavailable("busy", retry_after=retry_after)) == waited


@pytest.mark.parametrize(
    "header", ["86400", "1e12", "Fri, 31 Dec 9999 23:59:59 GMT"], ids=["a-day", "huge-number", "far-http-date"]
)
async def test_a_marketplace_asking_for_a_day_is_tried_again_within_the_cap(flaky, monkeypatch, header):
    """The real client against a real server answering 503 with a huge
    Retry-After, and the real outbox retrying: its one wait is at most the cap.
    (An HTTP date is not read as Retry-After: the back-off applies, below the cap too.)"""
    client, script, seen = flaky
    script["/v1/agent/stacks/s1/status"] = [
        (503, {"message": "maintenance"}, {"Retry-After": header}),
        (200, {"accepted": True}, {}),
    ]
    sleeps = FastAsyncio()
    monkeypatch.setattr(outbox_module, "asyncio", sleeps)
    outbox = Outbox(client.send_report, AgentDB(None), base_delay=0.01, max_delay=30.0)
    outbox.put(STATUS, "s1", {"status": "APPLIED"})
    runner = asyncio.create_task(outbox.run())
    assert await outbox.drained(5)
    runner.cancel()
    assert seen == ["PUT /v1/agent/stacks/s1/status"] * 2 and outbox.sent == 1
    assert len(sleeps.delays) == 1 and 0 < sleeps.delays[0] <= MAX_RETRY_AFTER, sleeps.delays
    if header != "Fri, 31 Dec 9999 23:59:59 GMT":
        assert sleeps.delays == [MAX_RETRY_AFTER]  # the cap, not the outbox's back-off ceiling (30 s)


# ---- replies the client cannot use -------------------------------------------------------


@pytest.fixture
async def raw_server():
    """Answers every request with the handler in `handlers[0]`."""
    handlers: list = []

    async def handler(request: web.Request) -> web.StreamResponse:
        return await handlers[0](request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", handlers
    await runner.cleanup()


async def test_a_refusal_shows_the_marketplaces_message_short_and_never_its_body(raw_server):
    base_url, handlers = raw_server
    async with MarketplaceClient(base_url, "key", request_timeout=5) as client:
        handlers[:] = [lambda _r: _reply(web.json_response({"message": "m" * 10_000}, status=400))]
        with pytest.raises(MarketplaceRejected) as long_message:
            await client.put_init_state({})
        assert long_message.value.status == 400 and len(str(long_message.value)) < 600
        handlers[:] = [lambda _r: _reply(web.json_response({"message": "x", "pad": "p" * 200_000}, status=422))]
        with pytest.raises(MarketplaceRejected) as big_body:
            await client.put_init_state({})
        assert str(big_body.value) == "422: Unprocessable Entity", "a large error body is not read for its message"
        handlers[:] = [lambda _r: _reply(web.Response(status=409, body=b"{not json"))]
        with pytest.raises(MarketplaceRejected, match="409: Conflict"):
            await client.put_init_state({})


async def test_malformed_json_in_any_reply_is_a_rejection(raw_server):
    base_url, handlers = raw_server
    async with MarketplaceClient(base_url, "key", request_timeout=5) as client:
        handlers[:] = [lambda _r: _reply(web.Response(body=b'{"sessionId": ', content_type="application/json"))]
        with pytest.raises(MarketplaceRejected, match="malformed JSON in the reply to POST /agent/sessions"):
            await client.open_session({})
        with pytest.raises(MarketplaceRejected, match="malformed JSON in the reply to POST /agent/heartbeat"):
            await client.heartbeat({})


async def test_the_body_cap_is_the_clients_setting(raw_server):
    base_url, handlers = raw_server
    handlers[:] = [lambda _r: _reply(web.json_response({"jobs": [], "pad": "p" * 2000}))]
    async with MarketplaceClient(base_url, "key", request_timeout=5, max_body_bytes=1000) as small:
        with pytest.raises(MarketplaceRejected, match="larger than 1000 bytes"):
            await small.poll_jobs(0)
    async with MarketplaceClient(base_url, "key", request_timeout=5) as default:
        assert await default.poll_jobs(0) == []


async def test_a_reply_that_trickles_in_times_out(raw_server):
    """The timeout covers reading the body, not only the headers."""
    base_url, handlers = raw_server
    done = asyncio.Event()

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"jobs": [')
        await asyncio.wait_for(done.wait(), 5)
        return response

    handlers[:] = [trickle]
    async with MarketplaceClient(base_url, "key", request_timeout=0.3) as client:
        with pytest.raises(MarketplaceUnavailable, match="TimeoutError"):
            await client.open_session({})
    done.set()


async def _reply(response: web.StreamResponse) -> web.StreamResponse:
    return response

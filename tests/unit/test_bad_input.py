"""Bad input from the marketplace, end to end over real HTTP.

A stand-in for a broken marketplace (aiohttp on 127.0.0.1) answers the agent's
polls with malformed JSON, oversized bodies, replies that are not a job list,
and job lists mixing bad jobs with good ones. The agent's real client, poll
loop, dispatcher and outbox talk to it; only the Docker side is a stand-in.
Every bad reply must be refused as a MarketplaceRejected (never a ValueError
that would end the poll loop), every bad job refused and reported, and the
good jobs in the same reply must still run.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from support.fakes import FakeDeployer, FastAsyncio
from support.waiting import until
from support.wiring import agent_for, dispatcher_for

from gpuhost_agent.core import agent as agent_module
from gpuhost_agent.protocol import wire, wire_time
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.client import MarketplaceClient
from gpuhost_agent.uplink.outbox import Outbox
from gpuhost_agent.uplink.replies import MarketplaceRejected

CAP = 64 * 1024  # the client's body cap in these tests
SECRET_IN_BODY = "body-content-that-must-not-be-echoed"
TEMPLATE = {"name": "web", "description": "", "content": "services: {}\n", "environmentVariables": {}}


def job(job_id: str, job_type: str = wire.JOB_DEPLOY, **overrides) -> dict:
    raw = {
        "jobId": job_id,
        "type": job_type,
        "stackId": f"stack-{job_id}",
        "rentalId": "rental-1",
        "envId": "env-1",
        "stackName": "web",
        "template": TEMPLATE if job_type == wire.JOB_DEPLOY else None,
        "rental": {"rentalId": "rental-1", "gpuCount": 0, "endDate": None, "status": "ACTIVE"},
        "deliveries": 1,
        "createdAt": wire_time.iso(),
    }
    raw.update(overrides)
    return raw


# ---- replies of a broken marketplace ------------------------------------------------------


def raw_reply(body: bytes, content_type: str = "application/json"):
    async def reply(_request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type=content_type)

    return reply


def json_reply(value):
    return raw_reply(json.dumps(value).encode())


def endless_reply():
    """A JSON reply without Content-Length that never ends: only a client that
    stops reading at its cap gets past it."""

    async def reply(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = (json.dumps({"filler": SECRET_IN_BODY}) + " ").encode() * 512
        try:
            await response.write(b'{"jobs": [')
            for _ in range(100_000):  # 1 GiB and more: far past any sane cap
                await response.write(chunk)
        except (ConnectionResetError, RuntimeError):
            pass  # the client hung up, as it should
        return response

    return reply


class BrokenMarketplace:
    """Answers each poll with the next scripted reply (then an empty job list),
    and records what the agent reports."""

    def __init__(self):
        self.replies: list = []
        self.polls: list[dict] = []
        self.completions: dict[str, dict] = {}
        self.statuses: list[tuple[str, dict]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/agent/jobs", self.poll)
        app.router.add_post("/v1/agent/jobs/{jobId}/complete", self.complete)
        app.router.add_put("/v1/agent/stacks/{stackId}/status", self.status)
        app.router.add_put("/v1/agent/stacks/{stackId}/containers", self.accepted)
        return app

    async def poll(self, request: web.Request) -> web.StreamResponse:
        self.polls.append(dict(request.query))
        if self.replies:
            return await self.replies.pop(0)(request)
        await asyncio.sleep(0.05)
        return web.json_response({"jobs": []})

    async def complete(self, request: web.Request) -> web.Response:
        self.completions[request.match_info["jobId"]] = await request.json()
        return web.json_response({"jobId": request.match_info["jobId"]})

    async def status(self, request: web.Request) -> web.Response:
        self.statuses.append((request.match_info["stackId"], await request.json()))
        return web.json_response({"accepted": True})

    async def accepted(self, _request: web.Request) -> web.Response:
        return web.json_response({"accepted": True})


@pytest.fixture
async def broken():
    """(stand-in marketplace, the agent's real client against it)."""
    market = BrokenMarketplace()
    runner = web.AppRunner(market.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = MarketplaceClient(
        f"http://127.0.0.1:{runner.addresses[0][1]}/v1", "env-key", request_timeout=5, max_body_bytes=CAP
    )
    yield market, client
    await client.close()
    await runner.cleanup()


async def rejected(client: MarketplaceClient) -> MarketplaceRejected:
    with pytest.raises(Exception) as caught:
        await client.poll_jobs(0)
    assert isinstance(caught.value, MarketplaceRejected), repr(caught.value)
    assert not isinstance(caught.value, ValueError), "a ValueError is what used to end the poll loop"
    assert SECRET_IN_BODY not in str(caught.value), "the reply's content must not be echoed"
    return caught.value


# ---- the client ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"jobs": [{"jobId": "' + SECRET_IN_BODY.encode() + b'"',  # cut off
        b'{"jobs": [], "note": "\xff\xfe ' + SECRET_IN_BODY.encode() + b'"}',  # not UTF-8
        b'{"jobs": [{"rental": {"gpuCount": NaN}}], "x": "' + SECRET_IN_BODY.encode() + b'"}',  # not JSON's numbers
        b'{"jobs": [' + b"[" * 20_000 + b"]" * 20_000 + b"]}",  # nested past the parser's depth
        b'{"jobs": [], "n": ' + b"9" * 5000 + b"}",  # an integer Python will not parse
    ],
    ids=["truncated", "not-utf8", "nan", "too-deep", "huge-integer"],
)
async def test_malformed_json_is_a_rejection_not_a_value_error(broken, body):
    market, client = broken
    market.replies.append(raw_reply(body))
    exc = await rejected(client)
    assert exc.status == 200
    assert "malformed JSON in the reply to GET /agent/jobs" in str(exc)


async def test_an_oversized_reply_is_refused_by_its_length(broken):
    market, client = broken
    market.replies.append(json_reply({"jobs": [], "filler": SECRET_IN_BODY * (CAP // len(SECRET_IN_BODY) + 1)}))
    exc = await rejected(client)
    assert f"larger than {CAP} bytes" in str(exc)


async def test_an_endless_reply_is_cut_off_at_the_cap(broken):
    market, client = broken
    market.replies.append(endless_reply())
    exc = await asyncio.wait_for(rejected(client), 10)
    assert f"larger than {CAP} bytes" in str(exc)
    # Sixteen large jobs may pass the cap where one cannot: the next polls ask
    # for one job at a time, until the lost jobs are redelivered.
    await client.poll_jobs(0)
    assert [poll["max"] for poll in market.polls] == ["16", "1"]


@pytest.mark.parametrize(
    "reply", [{"jobs": "x"}, {"jobs": {"0": {}}}, {"jobs": None}, {}, {"no": "jobs"}, [], "jobs", None, 3]
)
async def test_a_reply_that_is_not_a_job_list_is_rejected(broken, reply):
    market, client = broken
    market.replies.append(json_reply(reply))
    exc = await rejected(client)
    assert "GET /agent/jobs answered without a" in str(exc)


async def test_a_reply_that_is_not_json_at_all_is_rejected(broken):
    market, client = broken
    market.replies.append(raw_reply(b"<html>" + SECRET_IN_BODY.encode() + b"</html>", "text/html"))
    exc = await rejected(client)
    assert "without a JSON object" in str(exc)


# ---- the agent's poll loop ----------------------------------------------------------------


@pytest.fixture
async def polling(broken, monkeypatch):
    """The agent's real poll loop, dispatcher and outbox against the broken
    marketplace: yields (marketplace, deployer, fast asyncio, the loop's task)."""
    market, client = broken
    fast = FastAsyncio()  # a refused poll waits at least 10 s
    monkeypatch.setattr(agent_module, "asyncio", fast)
    outbox = Outbox(client.send_report, AgentDB(None), base_delay=0.01)
    deployer = FakeDeployer()
    dispatcher = dispatcher_for(deployer, outbox)
    agent = agent_for(client, outbox=outbox, dispatcher=dispatcher)
    agent.intervals["jobPollWaitSeconds"] = 0
    outbox_task = asyncio.create_task(outbox.run())
    loop_task = asyncio.create_task(agent._poll_forever())
    yield market, deployer, fast, loop_task
    loop_task.cancel()
    await dispatcher.shutdown(5)
    await outbox.drained(5)
    outbox_task.cancel()
    await asyncio.gather(loop_task, outbox_task, return_exceptions=True)


async def test_the_poll_loop_survives_bad_replies_and_serves_the_good_jobs(polling):
    market, deployer, fast, loop_task = polling
    bad_jobs = {
        "bad-template-str": (job("bad-template-str", template="services: {}"), "template must be an object"),
        "bad-template-list": (job("bad-template-list", template=[TEMPLATE]), "template must be an object"),
        "bad-template-null": (job("bad-template-null", template=None), "template must be an object"),
        "bad-type": (job("bad-type", "gpu.reset"), "unknown job type 'gpu.reset'"),
        "bad-gpus-str": (job("bad-gpus-str", rental={"gpuCount": "abc"}), "rental.gpuCount"),
        "bad-gpus-huge": (job("bad-gpus-huge", rental={"gpuCount": 10**40}), "rental.gpuCount"),
        "bad-gpus-neg": (job("bad-gpus-neg", rental={"gpuCount": -2}), "rental.gpuCount"),
        "bad-gpus-bool": (job("bad-gpus-bool", rental={"gpuCount": True}), "rental.gpuCount"),
        "bad-rental": (job("bad-rental", rental="rental-1"), "rental must be an object"),
        "bad-name": (job("bad-name", stackName={"x": 1}), "stackName must be a string"),
        "bad-vars": (
            job("bad-vars", template={**TEMPLATE, "environmentVariables": {"A": ["1"]}}),
            "template.environmentVariables.A must be a string",
        ),
        "bad-stack": (job("bad-stack", stackId="../../etc"), "stackId must be an id"),
        # Year 10000 once in UTC: it raised OverflowError, which ended the poll loop
        "bad-end": (job("bad-end", rental={"endDate": "9999-12-31T23:00:00-05:00"}), "rental.endDate"),
    }
    market.replies += [
        raw_reply(b'{"jobs": [{"jobId": '),  # malformed JSON
        endless_reply(),  # over the cap
        json_reply({"jobs": "x"}),  # not a job list
        json_reply(
            {
                "jobs": [raw for raw, _reason in bad_jobs.values()]
                + ["not a job", None, 7, job("../escape"), job("good-1")]
            }
        ),
    ]
    await until(lambda: "good-1" in market.completions and len(market.completions) >= len(bad_jobs) + 1)
    assert not loop_task.done(), "the poll loop must survive every bad reply"
    assert len(fast.delays) == 3 and all(delay >= 10 for delay in fast.delays), "refused polls back off"
    assert deployer.ran == ["good-1"]
    assert market.completions["good-1"]["outcome"] == wire.OUTCOME_SUCCEEDED
    for job_id, (_raw, reason) in bad_jobs.items():
        completion = market.completions[job_id]
        assert completion["outcome"] == wire.OUTCOME_FAILED
        assert completion["errorMsg"].startswith("job refused by the agent: ") and reason in completion["errorMsg"]
    errors = {stack_id: body["errorMsg"] for stack_id, body in market.statuses if body["status"] == wire.ERROR}
    for job_id in bad_jobs:
        if job_id != "bad-stack":  # a stack id that is not safe is never used, not even to report
            assert errors[f"stack-{job_id}"] == market.completions[job_id]["errorMsg"]
    assert "../escape" not in market.completions and "stack-../escape" not in errors

    # ... and it goes on serving: the next reply's job runs too.
    market.replies.append(json_reply({"jobs": [job("good-2", wire.JOB_REMOVE)]}))
    await until(lambda: "good-2" in market.completions)
    assert deployer.ran == ["good-1", "good-2"] and not loop_task.done()


async def test_a_template_that_is_not_an_object_never_reaches_an_agent_from_the_local_marketplace(market):
    """The local marketplace refuses it at the renter API already; the agent's
    own refusal (above) is for marketplaces that do not."""
    rental_id = await market.rental()
    for template in ("services: {}", [TEMPLATE], None, 3):
        status, body = await market.call("POST", f"/rentals/{rental_id}/stacks", {"template": template})
        assert status == 400 and "template must be an object" in body["message"], (template, body)
    assert not [j for j in market.store.jobs.values() if j.type == wire.JOB_DEPLOY]

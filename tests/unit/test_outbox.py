"""The outbox: coalescing, order, retry, and what the marketplace rejects."""

from __future__ import annotations

import asyncio

from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.outbox import CONTAINERS, JOB_COMPLETE, STATUS, Outbox
from gpuhost_agent.uplink.replies import MarketplaceRejected, MarketplaceUnavailable


async def test_outbox_coalesces_keeps_order_and_retries():
    sent: list[tuple[str, str, dict]] = []
    failures = {"left": 2}
    gate = asyncio.Event()

    async def send(report):
        await gate.wait()
        if failures["left"]:
            failures["left"] -= 1
            raise MarketplaceUnavailable("down", retry_after=0.01)
        sent.append((report.kind, report.target, report.body))

    outbox = Outbox(send, AgentDB(None), base_delay=0.01)
    outbox.put(STATUS, "s1", {"status": "APPLYING"})
    outbox.put(CONTAINERS, "s1", {"n": 1})
    outbox.put(STATUS, "s1", {"status": "APPLIED"})  # replaces APPLYING, keeps its place
    outbox.put(CONTAINERS, "s1", {"n": 2})
    outbox.put(JOB_COMPLETE, "j1", {"outcome": "succeeded"})
    runner = asyncio.create_task(outbox.run())
    gate.set()
    assert await outbox.drained(5)
    runner.cancel()
    assert sent == [
        (STATUS, "s1", {"status": "APPLIED"}),
        (CONTAINERS, "s1", {"n": 2}),
        (JOB_COMPLETE, "j1", {"outcome": "succeeded"}),
    ]


async def test_outbox_drops_what_the_marketplace_rejects():
    async def send(report):
        raise MarketplaceRejected(404, "unknown stack")

    outbox = Outbox(send, AgentDB(None))
    outbox.put(STATUS, "gone", {"status": "APPLIED"})
    runner = asyncio.create_task(outbox.run())
    assert await outbox.drained(2)
    runner.cancel()
    assert outbox.rejected == 1 and outbox.pending() == 0


async def test_a_report_in_back_off_goes_at_once_when_the_marketplace_answers_again():
    """retry_now (a heartbeat went through): no waiting out a back-off of up to 30 s."""
    down = {"now": True}

    async def send(report):
        if down["now"]:
            raise MarketplaceUnavailable("down", retry_after=30)

    outbox = Outbox(send, AgentDB(None), base_delay=30, max_delay=30)
    outbox.put(STATUS, "s1", {"status": "APPLIED"})
    runner = asyncio.create_task(outbox.run())
    await asyncio.sleep(0.05)  # the first try failed: 30 s of back-off from here
    down["now"] = False
    assert not await outbox.drained(0.2)
    outbox.retry_now()
    assert await outbox.drained(2)
    runner.cancel()
    assert outbox.sent == 1

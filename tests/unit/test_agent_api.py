"""The marketplace's side of the agent protocol refuses malformed reports and
judges staleness by instants, not by how a timestamp is written."""

from __future__ import annotations

import pytest
from support.stacks import TEMPLATE

from gpuhost_agent.protocol import wire, wire_time

CONTAINER = {"Name": "c", "Id": "i", "Created": 1, "Labels": [], "Ports": [], "State": "running"}


async def _stack(market) -> str:
    _, rental = await market.call("POST", "/rentals", {"envId": market.store.envId})
    _, stack_id = await market.call("POST", f"/rentals/{rental['rentalId']}/stacks", {"template": TEMPLATE})
    return stack_id


@pytest.mark.parametrize(
    "report, fragment",
    [
        ({"status": "APPLIED", "reportedAt": "zzz"}, "reportedAt"),
        ({"status": "APPLIED"}, "reportedAt"),
        ({"status": "DONE", "reportedAt": "2026-01-01T00:00:00Z"}, "status"),
        ({"status": "ERROR", "reportedAt": "2026-01-01T00:00:00Z"}, "errorMsg"),
        ({"status": "ERROR", "errorMsg": 7, "reportedAt": "2026-01-01T00:00:00Z"}, "errorMsg"),
        ({"status": "APPLIED", "pStackName": 5, "reportedAt": "2026-01-01T00:00:00Z"}, "pStackName"),
        ({"status": "APPLIED", "pStackId": True, "reportedAt": "2026-01-01T00:00:00Z"}, "pStackId"),
    ],
)
async def test_malformed_status_reports_are_refused(market, report, fragment):
    stack_id = await _stack(market)
    status, body = await market.call("PUT", f"/agent/stacks/{stack_id}/status", report, key=market.store.envApiKey)
    assert status == 400 and fragment in body["message"]
    assert market.store.stacks[stack_id]["status"] == wire.APPLYING


@pytest.mark.parametrize(
    "containers, fragment",
    [
        ([1], "containers[0]"),
        ([{**CONTAINER, "Created": "1"}], "Created"),
        ([{**CONTAINER, "Labels": {}}], "Labels"),
    ],
)
async def test_malformed_container_lists_are_refused(market, containers, fragment):
    stack_id = await _stack(market)
    status, body = await market.call(
        "PUT",
        f"/agent/stacks/{stack_id}/containers",
        {"containers": containers, "observedAt": wire_time.iso()},
        key=market.store.envApiKey,
    )
    assert status == 400 and fragment in body["message"]


async def test_staleness_compares_instants(market):
    stack_id = await _stack(market)
    key = market.store.envApiKey

    async def report(status, at):
        code, body = await market.call(
            "PUT", f"/agent/stacks/{stack_id}/status", {"status": status, "reportedAt": at}, key=key
        )
        assert code == 200
        return body["accepted"]

    assert await report(wire.APPLIED, "2026-01-01T12:00:00.500000Z")
    assert not await report(wire.APPLYING, "2026-01-01T12:00:00Z"), "12:00:00 is before 12:00:00.5"
    assert not await report(wire.APPLYING, "2026-01-01T13:00:00+02:00"), "13:00+02:00 is 11:00 UTC"
    assert await report(wire.APPLYING, "2026-01-01T12:30:00+00:00")
    assert market.store.stacks[stack_id]["status"] == wire.APPLYING


async def test_stopping_answers_every_waiting_long_poll_and_a_restart_serves_them_again(tmp_path):
    """An agent's long poll (aiohttp does not cancel a handler whose client
    went away) answers at once, empty, when the marketplace stops, instead of
    holding the shutdown; started again, the marketplace waits for jobs again."""
    import asyncio

    from gpuhost_agent.local_marketplace import server
    from gpuhost_agent.local_marketplace.state import MarketplaceState
    from gpuhost_agent.local_marketplace.store import Store

    state = MarketplaceState(Store.load_or_create(tmp_path / "m.json", "renter-key"))
    running = await server.start(state, "127.0.0.1", 0)
    waiting = asyncio.create_task(state.wait_for_jobs(60, 1))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await running.stop()
    assert await asyncio.wait_for(waiting, 1) == []
    running = await server.start(state, "127.0.0.1", 0)
    waiting = asyncio.create_task(state.wait_for_jobs(60, 1))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # not answered at once: the server is not closing any more
    waiting.cancel()
    await running.stop()

"""A second session on the environment's key: the
running agent is told its session was superseded (409), opens a new one and
goes on; a second live agent on the same key is reported as an error, and
the agent backs off instead of taking turns with it."""

from __future__ import annotations

import asyncio

from support.waiting import until

from gpuhost_agent.protocol import wire


async def _open_stray_session(renter) -> int:
    status, _ = await renter.call("POST", "/agent/sessions", {"agentVersion": "stray"}, key=renter.store.envApiKey)
    return status


async def test_a_superseded_agent_opens_its_session_again_and_deploys(local_market) -> None:
    renter, parts, local = local_market
    first = local.state.session_id
    assert await _open_stray_session(renter) == 200
    await until(lambda: local.state.session_id not in (first, None) and parts.session.connected.is_set(), timeout=10)
    await until(lambda: parts.client.session_id == local.state.session_id, timeout=10)
    rental_id, stack_id, _job = await renter.deployed()
    stack = next(s for s in await renter.stacks(rental_id) if s["stackId"] == stack_id)
    assert stack["status"] == wire.APPLIED
    assert parts.session.conflict is None  # once is a restart or a stray client, not another agent


async def test_another_live_agent_on_the_key_is_an_error_and_the_agent_backs_off(local_market) -> None:
    renter, parts, local = local_market
    opened_before = local.state.sessions_opened
    for _ in range(12):  # "another agent": a new session every half second, for six seconds
        assert await _open_stray_session(renter) == 200
        await asyncio.sleep(0.5)
    assert parts.session.conflict == "another agent uses this environment's key"
    ours = local.state.sessions_opened - opened_before - 12
    assert ours <= 2, f"the agent opened {ours} sessions in 6 s: it takes turns instead of backing off"

"""A stack belongs to the rental that made it (issue 49, item 4): a job that
names an existing stack under another rental redeployed or removed it under
that rental (the same Compose project, the same volumes). It is refused and
answered, and the stack and its status are left as they are."""

from __future__ import annotations

import asyncio

from support.fakes import FakeDeployer, Recorder
from support.wiring import dispatcher_for

from gpuhost_agent.protocol import wire
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.outbox import JOB_COMPLETE, STATUS, Outbox


def _remove(job_id: str, rental_id: str) -> dict:
    return {"jobId": job_id, "type": wire.JOB_REMOVE, "stackId": "victims-stack", "rentalId": rental_id,
            "envId": "e1", "stackName": "web", "template": None, "rental": {"gpuCount": 0}}  # fmt: skip


async def test_a_job_for_another_rentals_stack_is_refused_and_the_stack_left_alone() -> None:
    db = AgentDB(None)
    db.stack_status("victims-stack", "rental-victim", "e1", "victims-project", wire.APPLIED)
    sent = Recorder()
    outbox, deployer = Outbox(sent, db, base_delay=0.01), FakeDeployer()
    dispatcher = dispatcher_for(deployer, outbox, db=db)
    runner = asyncio.create_task(outbox.run())
    try:
        dispatcher.submit(_remove("attack", "rental-attacker"))
        dispatcher.submit(_remove("own", "rental-victim"))
        await dispatcher.shutdown(5)
        assert await outbox.drained(5)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    completions = {target: body for kind, target, body in sent.got if kind == JOB_COMPLETE}
    assert completions["attack"]["outcome"] == wire.OUTCOME_FAILED
    assert "belongs to another rental" in completions["attack"]["errorMsg"]
    assert deployer.ran == ["own"]  # its own rental's job still runs
    refused = [body for kind, target, body in sent.got if kind == STATUS and "another rental" in str(body)]
    assert refused == [], "the victim's stack is not reported ERROR for the attacker's job"

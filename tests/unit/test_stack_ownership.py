"""A stack belongs to the rental that made it: a job that
names an existing stack under another rental redeployed or removed it under
that rental (the same Compose project, the same volumes). It is refused and
answered, and the stack and its status are left as they are."""

from __future__ import annotations

from test_decoders_property import _dispatch

from gpuhost_agent.protocol import wire
from gpuhost_agent.storage.agent_db import AgentDB


def _remove(job_id: str, rental_id: str) -> dict:
    return {"jobId": job_id, "type": wire.JOB_REMOVE, "stackId": "victims-stack", "rentalId": rental_id,
            "envId": "e1", "stackName": "web", "template": None, "rental": {"gpuCount": 0}}  # fmt: skip


async def test_a_job_for_another_rentals_stack_is_refused_and_the_stack_left_alone() -> None:
    db = AgentDB(None)
    db.stack_status("victims-stack", "rental-victim", "e1", "victims-project", wire.APPLIED)
    deployer, completions, statuses = await _dispatch(
        [_remove("attack", "rental-attacker"), _remove("own", "rental-victim")], db
    )
    assert completions["attack"]["outcome"] == wire.OUTCOME_FAILED
    assert "belongs to another rental" in completions["attack"]["errorMsg"]
    assert deployer.ran == ["own"]  # its own rental's job still runs
    refused = [body for _target, body in statuses if "another rental" in str(body)]
    assert refused == [], "the victim's stack is not reported ERROR for the attacker's job"

"""The marketplace's jobs and templates as the agent reads them: defaults filled, malformed ones refused."""

from __future__ import annotations

import pytest

from gpuhost_agent.protocol import wire, wire_jobs


def test_validate_template_fills_defaults_and_rejects_wrong_types():
    t = wire_jobs.validate_template(
        {"name": "n", "description": "", "content": "c", "environmentVariables": {"A": "1"}}
    )
    assert t["insecure"] is False and t["isSSHEnabled"] is False and t["isBasicAuthEnabled"] is False
    with pytest.raises(wire_jobs.InvalidBody, match="name must not be empty"):
        wire_jobs.validate_template({**t, "name": "  "})
    with pytest.raises(wire_jobs.InvalidBody, match="larger than"):
        wire_jobs.validate_template({**t, "content": "x" * (wire_jobs.MAX_CONTENT_BYTES + 1)})


@pytest.mark.parametrize(
    "bad", [{"stackId": "../../etc"}, {"jobId": "a/b"}, {"type": "stack.explode"}, {"template": None}, {"rentalId": ""}]
)
def test_stack_job_refuses_malformed_jobs(bad):
    good = {
        "jobId": "j1",
        "type": wire.JOB_DEPLOY,
        "stackId": "s1",
        "rentalId": "r1",
        "envId": "e1",
        "template": {"name": "n", "description": "", "content": "c", "environmentVariables": {}},
    }
    assert wire_jobs.StackJob.from_wire(good).stack_id == "s1"
    with pytest.raises(wire_jobs.InvalidBody):
        wire_jobs.StackJob.from_wire({**good, **bad})

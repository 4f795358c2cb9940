"""A deploy catches errors by family (gpuhost_agent/errors.py): whatever was
refused or failed outside the agent, the Compose CLI's own error among them,
ends as ERROR with its reason after what was started is taken down; an error
of no family (a bug) is left to the dispatcher."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fakes import FakeEngine, FakeReporter

from gpuhost_agent.core.images.pulls_elsewhere import PullsElsewhere
from gpuhost_agent.core.stacks.deployer import DeployParts, DeploySettings, StackDeployer
from gpuhost_agent.protocol import wire, wire_jobs
from gpuhost_agent.runtime.compose import ComposeError
from gpuhost_agent.storage.agent_db import AgentDB

COMPOSE = "services:\n  app:\n    image: busybox\n"


class FailingBackend:
    """A backend whose preparation raises the error given; records take-downs."""

    def __init__(self, error: Exception) -> None:
        self.error, self.taken_down = error, []

    async def prepare(self, project: str, original: Path, variables: dict[str, str], raw: object) -> object:
        raise self.error

    async def take_down_failed(self, project: str, workdir: Path, stack_id: str) -> None:
        self.taken_down.append(project)


def _deployer(tmp_path: Path, error: Exception) -> tuple[StackDeployer, FailingBackend, FakeReporter]:
    backend, reporter = FailingBackend(error), FakeReporter()
    parts = DeployParts(
        backend=backend,  # type: ignore[arg-type]
        engine=FakeEngine(),  # type: ignore[arg-type]
        reporter=reporter,  # type: ignore[arg-type]
        sandbox=None,  # type: ignore[arg-type]  # never reached: the preparation fails first
        db=AgentDB(tmp_path / "agent.db"),
        images=PullsElsewhere(),
        rental_limit_reached=lambda *_: False,  # type: ignore[arg-type,return-value]
    )
    settings = DeploySettings(
        stacks_dir=tmp_path / "stacks", home_dir=tmp_path, settle_seconds=0, stop_timeout=1, stacks_per_rental=0
    )
    return StackDeployer(parts=parts, settings=settings), backend, reporter


def _job() -> wire_jobs.StackJob:
    return wire_jobs.StackJob("job-1", wire.JOB_DEPLOY, "stack-1", "rental-1", "env-1", "s", {"content": COMPOSE})


async def test_an_error_of_the_outside_family_ends_the_deploy_as_error_after_the_take_down(tmp_path) -> None:
    deployer, backend, reporter = _deployer(tmp_path, ComposeError("compose config: no such service"))
    message = await deployer.deploy(_job())
    assert message == "compose config: no such service"
    assert len(backend.taken_down) == 1
    assert reporter.reports[-1] == ("stack-1", wire.ERROR, message)


async def test_a_bug_is_not_taken_for_a_failure_and_reaches_the_dispatcher(tmp_path) -> None:
    """An error of no family (a bug) is not reported as the stack's failure
    here: the dispatcher logs it with its traceback and says "internal agent error"."""
    deployer, backend, reporter = _deployer(tmp_path, KeyError("services"))
    with pytest.raises(KeyError):
        await deployer.deploy(_job())
    assert backend.taken_down == [] and all(status != wire.ERROR for _, status, _ in reporter.reports)

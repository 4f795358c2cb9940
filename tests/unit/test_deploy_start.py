"""The start of a deploy: `compose config` and an `up` that waits
on stdin start together, and a stack the sandbox or Compose refuses leaves no
`up` behind. Real Compose, no engine: a waiting `up` asks the engine nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpuhost_agent.core.sandbox.apply import review_raw
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.core.stacks.deploy_start import start_compose
from gpuhost_agent.runtime.compose import ComposeRunner, PendingUp, find_compose_command
from gpuhost_agent.runtime.engine.client import EngineError

GOOD = "services:\n  app:\n    image: gpuhost-test/busybox:1\n"
# Valid YAML the raw review lets through, which Compose's own schema refuses.
REFUSED_BY_COMPOSE = "services:\n  app:\n    image: gpuhost-test/busybox:1\n    networks: [nowhere]\n"


class _Engine:
    def __init__(self, fails: bool = False):
        self.fails = fails

    async def foreign_names(self, project: str) -> frozenset[str]:
        if self.fails:
            raise EngineError("engine away")
        return frozenset({"someone-elses-net"})


async def _setup(tmp_path: Path, text: str, monkeypatch) -> tuple[ComposeRunner, Path, list[PendingUp]]:
    runner = ComposeRunner(await asyncio.to_thread(find_compose_command), tmp_path / "docker-config")
    started: list[PendingUp] = []
    start_up = ComposeRunner.start_up

    async def recording(self: ComposeRunner, project: str, workdir: Path) -> PendingUp:
        up = await start_up(self, project, workdir)
        started.append(up)
        return up

    monkeypatch.setattr(ComposeRunner, "start_up", recording)
    original = tmp_path / "stack" / "compose.yaml"
    await asyncio.to_thread(original.parent.mkdir)
    await asyncio.to_thread(original.write_text, text)
    return runner, original, started


async def test_config_and_a_waiting_up_start_together(tmp_path, monkeypatch) -> None:
    runner, original, started = await _setup(tmp_path, GOOD, monkeypatch)
    model, names, up = await start_compose(runner, _Engine(), "p-good", original, {}, review_raw(GOOD))
    try:
        assert model["services"]["app"]["image"] == "gpuhost-test/busybox:1"
        assert names == {"someone-elses-net"}
        assert started == [up] and up.process.returncode is None  # waiting for its file on stdin
        assert up.args[up.args.index("-f") + 1] == "-"
    finally:
        await up.discard()
    assert up.process.returncode is not None


@pytest.mark.parametrize("engine_fails", [False, True])
async def test_a_refused_stack_leaves_no_up_waiting(tmp_path, monkeypatch, engine_fails) -> None:
    text = GOOD if engine_fails else REFUSED_BY_COMPOSE
    runner, original, started = await _setup(tmp_path, text, monkeypatch)
    with pytest.raises(EngineError if engine_fails else StackRejected) as refused:
        await start_compose(runner, _Engine(fails=engine_fails), "p-bad", original, {}, review_raw(text))
    if not engine_fails:
        assert "nowhere" in str(refused.value)
    assert len(started) == 1
    assert started[0].process.returncode is not None  # stopped before it read anything

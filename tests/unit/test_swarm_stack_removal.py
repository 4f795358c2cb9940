"""Removing a stack from a Swarm: `docker stack rm` can remove the services
and be refused the network a stopping task still holds ("is in use by task",
moby/moby#30942; seen in CI). The agent's removal must go on until the
network is gone, not report a failed removal of a stack whose services are
already gone. The docker CLI here is a real program standing in for the
answers the real one gave in that run; the engine is a list of what the
manager still has."""

from __future__ import annotations

import asyncio

import pytest

from gpuhost_agent.runtime import swarm_stacks
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.swarm_stacks import SwarmStacks

IN_USE_ANSWER = (
    "Removing service c36_ollama\\nRemoving network c36_default\\n"
    "Failed to remove network 40yox: Error response from daemon: rpc error: code = FailedPrecondition "
    "desc = network 40yox is in use by task 2l1tfailed to remove some resources from stack: c36"
)


GONE_ANSWER = (
    "Removing network c36_default\\nFailed to remove network dwik: Error response from daemon: "
    "network dwik not foundfailed to remove some resources from stack: c36"
)
NOT_MANAGER = "Error response from daemon: this node is not a swarm manager"


class ManagerView:
    """What the manager lists: the stack's network until `docker stack rm` ran `left` times."""

    def __init__(self, calls_file, left: int):
        self.calls_file = calls_file
        self.left = left

    async def swarm_list(self, kind: str, labels=None) -> list[dict]:
        runs = len(await asyncio.to_thread(self.runs))
        return [{"Name": "c36_default"}] if kind == "networks" and runs < self.left else []

    def runs(self) -> list[str]:
        return self.calls_file.read_text().splitlines() if self.calls_file.exists() else []


def fake_cli(tmp_path, answers: list[tuple[int, str]]):
    """A docker CLI that answers each run with the next of `answers` and logs its arguments."""
    calls = tmp_path / "calls"
    lines = ["#!/bin/sh", f'echo "$*" >> {calls}', f"n=$(wc -l < {calls})"]
    for number, (code, text) in enumerate(answers, start=1):
        lines.append(f'if [ "$n" -ge {number} ]; then last_code={code}; last_text="{text}"; fi')
    lines += ['printf "$last_text\\n"', "exit $last_code"]
    script = tmp_path / "docker"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script, calls


async def test_a_network_still_in_use_is_removed_by_another_stack_rm(tmp_path, monkeypatch) -> None:
    """The second run finds the network gone already (it was going when listed)."""
    monkeypatch.setattr(swarm_stacks, "REMOVE_RETRY_SECONDS", 0.01)
    answers = [(1, IN_USE_ANSWER), (1, GONE_ANSWER), (0, "Nothing found in stack: c36")]
    script, calls = await asyncio.to_thread(fake_cli, tmp_path, answers)
    stacks = SwarmStacks(ManagerView(calls, left=3), docker_cli=str(script))  # type: ignore[arg-type]
    await stacks.remove("c36", timeout=10)
    assert await asyncio.to_thread(calls.read_text) == "stack rm c36\n" * 3


async def test_any_other_refusal_is_said_with_the_clis_words(tmp_path) -> None:
    script, calls = await asyncio.to_thread(fake_cli, tmp_path, [(1, NOT_MANAGER)])
    stacks = SwarmStacks(ManagerView(calls, left=5), docker_cli=str(script))  # type: ignore[arg-type]
    with pytest.raises(EngineError, match="docker stack rm failed: .*not a swarm manager"):
        await stacks.remove("c36", timeout=10)

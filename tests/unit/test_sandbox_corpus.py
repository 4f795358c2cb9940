"""The sandbox policy against the corpus in tests/sandbox_corpus/ (its README
says what each file tries or shows).

The decision alone, on Compose's real normalised model (the real Compose CLI,
no engine): every hostile file is refused naming its service and key, every
legitimate one passes. End to end through the local marketplace and the agent
on the real engine: tests/integration/test_sandbox_corpus_engine.py.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from support.sandbox_corpus import CORPUS, HOSTILE, LEGIT, header
from support.sandbox_decide import FOREIGN, RENTAL_GPUS, assert_sandboxed, decide_file

from gpuhost_agent.core.sandbox.context import GIB
from gpuhost_agent.runtime.compose import ComposeRunner, find_compose_command


def test_the_corpus_is_big_enough_and_documented() -> None:
    assert len(HOSTILE) >= 40 and len(LEGIT) >= 8
    for path in HOSTILE:
        assert {"tries", "service", "expect"} <= set(header(path)), path.name
    for path in LEGIT:
        assert "shows" in header(path), path.name
    readme = (CORPUS / "README.md").read_text()
    assert all(path.name in readme for path in HOSTILE + LEGIT)


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> ComposeRunner:
    return ComposeRunner(find_compose_command(), tmp_path_factory.mktemp("docker-config"))


async def _decide(compose: ComposeRunner, path: Path, workdir: Path) -> tuple[list[str], dict | None]:
    text = await asyncio.to_thread(path.read_text)
    problems, hardened, _ = await decide_file(compose, text, workdir / "stacks" / "stack", FOREIGN)
    return problems, hardened


@pytest.mark.parametrize("path", HOSTILE, ids=[p.stem for p in HOSTILE])
async def test_hostile_file_is_refused_or_made_safe(compose, path, tmp_path) -> None:
    text = await asyncio.to_thread(path.read_text)
    problems, hardened, notices = await decide_file(compose, text, tmp_path / "stacks" / "stack", FOREIGN)
    expected = header(path)
    outcome = expected.get("outcome", "refused")
    if outcome == "refused":
        named = [text for text in problems if expected["expect"] in text]
        assert named, f"{path.name}: {expected['tries']}: got {problems}"
        if expected["service"] != "-":
            assert any(f'"{expected["service"]}"' in text for text in named) or "extends" in expected["expect"], named
        return
    assert problems == [] and hardened is not None, (path.name, problems)
    if outcome == "rewritten":
        assert any(expected["expect"] in notice for notice in notices), (path.name, notices)
    assert_sandboxed(hardened)
    seen = json.dumps([hardened, notices])  # no value of the agent's own environment (170)
    assert str(compose.home_dir) not in seen and os.environ["PATH"] not in seen, path.name


@pytest.mark.parametrize("path", LEGIT, ids=[p.stem for p in LEGIT])
async def test_legitimate_file_passes_and_is_hardened(compose, path, tmp_path) -> None:
    problems, hardened = await _decide(compose, path, tmp_path)
    assert problems == [], problems
    wanted = (
        json.loads(header(path).get("expect-gpus", "{}").replace("{", '{"').replace(": ", '": '))
        if header(path).get("expect-gpus")
        else {}
    )
    for name, service in hardened["services"].items():
        assert service["security_opt"] == ["no-new-privileges:true"] and "NET_RAW" in service["cap_drop"]
        assert int(service["mem_limit"]) <= 8 * GIB and service["cpus"] <= 4.0 and service["pids_limit"] <= 4096
        visible = service["environment"]["NVIDIA_VISIBLE_DEVICES"]
        assert visible == (",".join(RENTAL_GPUS[: wanted[name]]) if name in wanted else "void"), name

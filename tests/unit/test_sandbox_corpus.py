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
from pathlib import Path

import pytest
from support.sandbox_corpus import CORPUS, HOSTILE, LEGIT, header

from gpuhost_agent.core.compose_rewrite import StackRejected
from gpuhost_agent.core.sandbox import refuse_raw
from gpuhost_agent.core.sandbox_context import GIB, SandboxContext
from gpuhost_agent.core.sandbox_harden import harden
from gpuhost_agent.core.sandbox_policy import policy_violations
from gpuhost_agent.runtime.compose import ComposeError, ComposeRunner, find_compose_command

RENTAL_GPUS = ("GPU-11111111-1111-1111-1111-111111111111", "GPU-22222222-2222-2222-2222-222222222222")


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
    """The refusals the agent would give (raw check, Compose's own errors, the policy)."""
    text = await asyncio.to_thread(path.read_text)
    try:
        refuse_raw(text)
    except StackRejected as exc:
        return [str(exc)], None
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread((workdir / "compose.yaml").write_text, text)
    try:
        model = await compose.config("corpus", workdir, "compose.yaml", {})
    except ComposeError as exc:
        return [f"invalid Compose file: {exc}"], None
    ctx = SandboxContext(project="corpus", gpu_uuids=RENTAL_GPUS, cpus=4.0, memory_bytes=8 * GIB)
    return policy_violations(model, ctx), harden(model, ctx)


@pytest.mark.parametrize("path", HOSTILE, ids=[p.stem for p in HOSTILE])
async def test_hostile_file_is_refused_naming_service_and_key(compose, path, tmp_path) -> None:
    problems, _ = await _decide(compose, path, tmp_path)
    expected = header(path)
    named = [text for text in problems if expected["expect"] in text]
    assert named, f"{path.name}: {expected['tries']}: got {problems}"
    if expected["service"] != "-":
        assert any(f'"{expected["service"]}"' in text for text in named) or "extends" in expected["expect"], named


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

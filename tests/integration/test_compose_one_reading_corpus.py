"""Compose reads the agent's serialisation of a renter's file as it reads the
file itself (tests/unit/test_compose_one_reading.py says
why the agent hands Compose its own serialisation of the checked nodes). The
real Compose, no engine; here rather than in the fast suite for its two
Compose runs per corpus file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from support.sandbox_corpus import CORPUS, LEGIT

from gpuhost_agent.core.sandbox import compose_yaml
from gpuhost_agent.runtime.compose import ComposeError, ComposeRunner, find_compose_command

PUBLISHED = sorted((CORPUS / "published").glob("*.yaml"))


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> ComposeRunner:
    return ComposeRunner(find_compose_command(), tmp_path_factory.mktemp("docker-config"))


async def _model(compose: ComposeRunner, folder: Path, text: str) -> dict | None:
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread((folder / "compose.yaml").write_text, text)
    try:
        return await compose.config("corpus", folder, "compose.yaml", {})
    except ComposeError:
        return None


@pytest.mark.parametrize("path", PUBLISHED + LEGIT, ids=[p.stem for p in PUBLISHED + LEGIT])
async def test_compose_reads_the_agents_serialisation_as_it_read_the_file(compose, path, tmp_path) -> None:
    """What Compose reads is the agent's serialisation of the checked nodes:
    for every published and legitimate file, the real Compose's model of it
    is the model of the file as written (a file Compose refuses as written,
    for a missing env file or build context, is left out)."""
    text = await asyncio.to_thread(path.read_text)
    original = await _model(compose, tmp_path / "original", text)
    if original is None:
        pytest.skip("Compose refuses the file as written (a file of the author's machine it names)")
    written = compose_yaml.write(compose_yaml.node_tree(text))  # type: ignore[arg-type]
    again = await _model(compose, tmp_path / "written", written)
    assert again is not None
    as_json = json.dumps(original, sort_keys=True).replace(str(tmp_path / "original"), "DIR")
    assert as_json == json.dumps(again, sort_keys=True).replace(str(tmp_path / "written"), "DIR")

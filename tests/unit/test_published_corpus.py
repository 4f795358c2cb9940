"""Compose files as GPU projects publish them (tests/sandbox_corpus/published/,
each with its repository, path and commit in a header, byte for byte below
it) through the agent's decision: the raw pass, the real Compose CLI's
normalisation, the rewrites and the policy.

Each file deploys or is refused as tests/sandbox_corpus/published/outcomes.yaml
says; a refusal names every problem listed there in one message; a deployed
file's hardened model holds the sandbox's invariants, and is written for a Swarm
(core/swarm/stack_file.py): every service pinned and capped, every network the
stack's own overlay. End to end on the real engine:
tests/integration/test_published_corpus_engine.py.
"""

from __future__ import annotations

import asyncio
import re

import pytest
import yaml
from support.sandbox_corpus import CORPUS
from support.sandbox_decide import RENTAL_GPUS, assert_sandboxed, decide_file
from support.settings import stack_context

from gpuhost_agent.core.sandbox.context import GIB
from gpuhost_agent.core.swarm.stack_file import SwarmPlacement, swarm_stack
from gpuhost_agent.runtime.compose import ComposeRunner, find_compose_command

PUBLISHED = sorted((CORPUS / "published").glob("[0-9]*.yaml"))
OUTCOMES = yaml.load((CORPUS / "published" / "outcomes.yaml").read_text(), Loader=yaml.CSafeLoader)  # noqa: S506 - safe, in C
# The context decide_file hardens with, and a Swarm of two machines: the GPUs on one, the rest at home.
SWARM_CTX = stack_context(project="corpus", gpu_uuids=RENTAL_GPUS, cpus=4.0, memory_bytes=8 * GIB)
GPU_MACHINE = SwarmPlacement(gpu_nodes={uuid: "node-gpu" for uuid in RENTAL_GPUS}, home_node="node-home")
HEADER = re.compile(
    r"^# source: https://github\.com/(\S+)/blob/([0-9a-f]{40})/(\S+)\n# repository: \1  path: \3  commit: \2\n"
)


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> ComposeRunner:
    return ComposeRunner(find_compose_command(), tmp_path_factory.mktemp("docker-config"))


def test_the_corpus_is_published_files_with_their_source() -> None:
    assert len(PUBLISHED) >= 30
    assert sorted(OUTCOMES) == [path.name for path in PUBLISHED]
    for path in PUBLISHED:
        assert HEADER.match(path.read_text()), path.name


def test_four_in_five_files_that_could_run_deploy() -> None:
    """Of the files that name their images, stand alone, are valid Compose and
    hold no real escape, at least four in five deploy as pasted."""
    could_run = [
        name for name, what in OUTCOMES.items() if what.get("class") not in ("escape", "no-image", "not-standalone")
    ]
    deploys = [name for name in could_run if OUTCOMES[name]["outcome"] == "deploys"]
    assert len(deploys) >= 0.8 * len(could_run), (deploys, could_run)


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.stem for p in PUBLISHED])
async def test_published_file_deploys_safely_or_is_refused_with_every_problem(compose, path, tmp_path) -> None:
    expected = OUTCOMES[path.name]
    text = await asyncio.to_thread(path.read_text)
    problems, hardened, notices = await decide_file(
        compose, text, tmp_path / "stacks" / "stack", variables=expected.get("variables")
    )
    if expected["outcome"] == "deploys":
        assert problems == [], problems
        assert_sandboxed(hardened)
        assert not any("/stacks/" in notice or str(tmp_path) in notice for notice in notices), notices
        _assert_written_for_swarm(hardened)
        return
    assert len(problems) == 1, problems  # one message
    missing = [part for part in expected["expect"] if part not in problems[0]]
    assert not missing, (missing, problems[0])
    assert str(tmp_path) not in problems[0] and str(compose.home_dir) not in problems[0], problems[0]


def _assert_written_for_swarm(hardened: dict) -> None:
    """The hardened file as a Swarm leader deploys it: no key passed through
    unknown, each service pinned to its machine (GPU services to the GPUs')
    and capped, each network the stack's own overlay."""
    stack, _ = swarm_stack(hardened, SWARM_CTX, GPU_MACHINE)
    for name, service in stack["services"].items():
        gpus = hardened["services"][name]["environment"]["NVIDIA_VISIBLE_DEVICES"] != "void"
        assert service["deploy"]["placement"]["constraints"] == [f"node.id == node-{'gpu' if gpus else 'home'}"], name
        assert set(service["deploy"]["resources"]["limits"]) == {"memory", "cpus", "pids"}, name
    assert all(net["driver"] == "overlay" and net["attachable"] is False for net in stack["networks"].values())

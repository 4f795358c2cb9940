"""Small sandbox points an attacker found, through the real
Compose CLI and the agent's whole decision (tests/support/sandbox_decide.py).
Each failed before its fix: `${HOME}`, `${PATH}` and `${DOCKER_CONFIG}`
were the agent's own (its docker config folder and PATH in the container's
environment), `develop:` kept its host paths in the hardened model, and a
volume's `subpath: ../../..` passed the policy."""

from __future__ import annotations

import json
import os

import pytest
from support.sandbox_decide import assert_sandboxed, decide_file

from gpuhost_agent.core.sandbox.interpolation import confined
from gpuhost_agent.runtime.compose import ComposeRunner, find_compose_command


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> ComposeRunner:
    return ComposeRunner(find_compose_command(), tmp_path_factory.mktemp("docker-config"))


AGENT_NAMES = "${HOME}:${PATH}:${DOCKER_CONFIG}:${DOCKER_HOST}:$HOME:${X:-$PATH}:${GOGC}"


async def test_the_agents_environment_never_fills_a_renters_variable(compose, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/agent-only-docker.sock")  # passed through to Compose
    text = f'services:\n  app:\n    image: busybox\n    environment:\n      X: "{AGENT_NAMES}"\n'
    problems, hardened, notices = await decide_file(compose, text, tmp_path / "stacks" / "s")
    assert problems == [] and hardened is not None
    assert hardened["services"]["app"]["environment"]["X"] == "::::::"
    seen = json.dumps([hardened, notices])
    for agents in (str(compose.home_dir), os.environ["PATH"], "agent-only-docker.sock"):
        assert agents not in seen
    for name in ("HOME", "PATH", "DOCKER_CONFIG", "DOCKER_HOST", "GOGC"):  # X has a default
        assert f'Compose warns: The "{name}" variable is not set. Defaulting to a blank string.' in notices
    assert "GPUHOST_TEMPLATE_" not in seen
    assert_sandboxed(hardened)


async def test_the_template_sets_any_name_and_compose_keeps_its_own(compose, tmp_path) -> None:
    text = (
        "services:\n  app:\n    image: busybox\n    environment:\n"
        '      X: "${HOME}:${PATH}:${DOCKER_CONFIG}"\n'
        "      ESCAPED: $$HOME and $${PATH}\n"
        "      PROJECT: ${COMPOSE_PROJECT_NAME}\n"
        "    labels:\n      $HOME: kept as written\n"
    )
    variables = {"HOME": "/models", "PATH": "/opt/bin"}
    problems, hardened, notices = await decide_file(compose, text, tmp_path / "stacks" / "s", variables=variables)
    assert problems == [] and hardened is not None
    service = hardened["services"]["app"]
    assert service["environment"]["X"] == "/models:/opt/bin:"
    assert service["environment"]["ESCAPED"] == "$$HOME and $${PATH}"  # Compose's escaping: `up` reads `$HOME`
    assert service["environment"]["PROJECT"] == "corpus"
    assert service["labels"]["$$HOME"] == "kept as written"  # keys are not interpolated
    assert notices == ['Compose warns: The "DOCKER_CONFIG" variable is not set. Defaulting to a blank string.']


async def test_compose_errors_name_the_variable_as_the_renter_wrote_it(compose, tmp_path) -> None:
    text = "services:\n  app:\n    image: busybox\n    environment:\n      T: ${HF_TOKEN:?set HF_TOKEN}\n"
    problems, _, _ = await decide_file(compose, text, tmp_path / "stacks" / "s")
    (problem,) = problems
    assert "HF_TOKEN" in problem and "GPUHOST_TEMPLATE_" not in problem, problem


@pytest.mark.parametrize(
    ("value", "renamed"),
    [
        ("$$HOME", "$$HOME"),
        ("$$$HOME", "$$$GPUHOST_TEMPLATE_HOME"),
        ("${A:-${B:-$$C}}", "${GPUHOST_TEMPLATE_A:-${GPUHOST_TEMPLATE_B:-$$C}}"),
        ("${COMPOSE_PROJECT_NAME}-$x_1", "${COMPOSE_PROJECT_NAME}-$GPUHOST_TEMPLATE_x_1"),
        ("$1 ${ 5$", "$1 ${ 5$"),
    ],
)
def test_references_are_renamed_as_compose_reads_them(value: str, renamed: str) -> None:
    assert confined(value) == renamed


async def test_develop_is_dropped_with_a_notice(compose, tmp_path) -> None:
    text = (
        "services:\n  app:\n    image: busybox\n    develop:\n      watch:\n"
        "        - {path: /etc, action: sync, target: /x}\n"
    )
    problems, hardened, notices = await decide_file(compose, text, tmp_path / "stacks" / "s")
    assert problems == [] and hardened is not None
    assert "develop" not in hardened["services"]["app"] and "/etc" not in json.dumps(hardened)
    assert any(notice.startswith('service "app": develop dropped') for notice in notices), notices


@pytest.mark.parametrize(
    ("subpath", "refused"),
    [
        ("../../..", True),
        ("/etc", True),
        ("a/../../b", True),
        ("./../x", True),
        ("a//..//..", True),
        ("models/llama", False),
        ("a/../b", False),
        ("./x", False),
    ],
)
async def test_a_volume_subpath_stays_inside_the_volume(compose, tmp_path, subpath: str, refused: bool) -> None:
    text = (
        "services:\n  app:\n    image: busybox\n    volumes:\n"
        f"      - {{type: volume, source: data, target: /d, volume: {{subpath: {json.dumps(subpath)}}}}}\n"
        "volumes:\n  data: {}\n"
    )
    problems, _, _ = await decide_file(compose, text, tmp_path / "stacks" / "s")
    if refused:
        (problem,) = problems
        assert f"service \"app\": volumes: subpath '{subpath}' of volume 'data' is not allowed" in problem
    else:
        assert problems == []

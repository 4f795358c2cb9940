"""The one adapter around the Docker Compose v2 CLI.

We run the real Compose rather than parse files ourselves: hosts already have
it and renters' files are written for it. Each call gets a fixed environment,
the same whatever the stack (`host_environment`): Compose's interpolation
cannot read the agent's own variables (its API key among them), renters'
pulls never use registry credentials the host keeps in ~/.docker (a
DOCKER_CONFIG of the agent's own), and no renter-chosen name or value ever
becomes the environment of a host process. The template's variables reach
Compose only as data, for interpolation: a private `--env-file` written for
the one `config` call that needs them (`write_variables`). Had they been the
process's environment, `LD_PRELOAD`, `LD_AUDIT`, `GCONV_PATH` and the like
would have made setpriv, the docker CLI or any dynamically linked program on
the way load a library the renter planted in a volume, as root. And since
Compose reads its own environment before the env file, the file's references
are renamed to the template's spelling first (core/sandbox/interpolation.py,
TEMPLATE_PREFIX), which only that env file defines: `${HOME}` is the
template's HOME or empty, never the agent's.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.common.visible import visible
from gpuhost_agent.errors import OutsideFailure
from gpuhost_agent.runtime.compose_command import ComposeNotFound, find_compose_command
from gpuhost_agent.runtime.host_process import HostProcesses, host_environment, kill

__all__ = [
    "ComposeError",
    "ComposeNotFound",
    "ComposeRunner",
    "PendingUp",
    "clean_error",
    "find_compose_command",
    "host_environment",
]

log = get_logger(__name__)

COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
COMPOSE_SERVICE_LABEL = "com.docker.compose.service"
STACK_NAMESPACE_LABEL = "com.docker.stack.namespace"  # what `docker stack deploy` labels a stack's parts with
VARIABLES_FILE = ".variables.env"  # in the stack's own 0700 folder, 0600, only during `config`
# How a renter's file names a template variable once the raw pass has renamed
# its references (core/sandbox/interpolation.py): no process environment has it.
TEMPLATE_PREFIX = "GPUHOST_TEMPLATE_"
_TEMPLATE_NAME = re.compile(re.escape(TEMPLATE_PREFIX) + r"(?=[_A-Za-z])")


def interpolation_variables(variables: dict[str, str]) -> dict[str, str]:
    """What the env file for `config` holds: the template's variables under
    their own names (Compose's own settings, COMPOSE_PROFILES, are read there)
    and under the template's spelling, which the renamed file refers to."""
    return {**variables, **{TEMPLATE_PREFIX + name: value for name, value in variables.items()}}


def renter_names(text: str) -> str:
    """Compose's message with the template's spelling of a name written as the
    renter wrote it (`The "HOME" variable is not set`)."""
    return _TEMPLATE_NAME.sub("", text)


_ENV_FILE_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "$": "\\$", "\n": "\\n", "\r": "\\r"})


def env_file_line(name: str, value: str) -> str:
    """`NAME="value"` that Compose's env-file reader gives back as exactly
    `value`: inside double quotes it expands `$` and reads backslash escapes,
    so backslash, quote and `$` are escaped and line breaks written as
    escapes (a raw one would end the line, and the value could then add a
    variable of its own). Names are checked before (core/stacks/project_input.py)."""
    return f'{name}="{value.translate(_ENV_FILE_ESCAPES)}"\n'


def write_variables(path: Path, variables: dict[str, str]) -> None:
    """The template's variables as Compose's env file: owner-only, created
    anew (never through a link someone left there)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write("".join(env_file_line(name, value) for name, value in sorted(variables.items())))


class ComposeError(OutsideFailure, RuntimeError):
    """Compose exited non-zero; the message is Compose's own, cleaned for a renter."""


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
        self.processes = HostProcesses(docker_config_dir)  # the one runner, shared with `docker stack`
        docker_config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    @property
    def home_dir(self) -> Path:
        """The HOME Compose runs with: where it resolves a file's `~`."""
        return self.docker_config_dir

    def use(self, command: list[str]) -> None:
        """The Compose command start-up found (core/host_reporter.py): used from now on."""
        self.command = command

    async def _start(self, args: list[str], *, cwd: Path, stdin: bool = False) -> asyncio.subprocess.Process:
        if not self.command and self.finder is not None:  # e.g. a rental ending before the marketplace answers
            try:
                self.command = await asyncio.to_thread(self.finder)
            except ComposeNotFound as exc:
                raise ComposeError(str(exc)) from None
        if not self.command:
            raise ComposeError("Docker Compose v2 is not available on this host yet")
        return await self.processes.start([*self.command, "--ansi", "never", *args], cwd=cwd, stdin=stdin)

    async def _finish(
        self,
        process: asyncio.subprocess.Process,
        args: list[str],
        *,
        cwd: Path,
        timeout: float,
        text: str | None = None,
        warnings: list[str] | None = None,
    ) -> str:
        """Compose's output once it exits; `text` is written to its stdin
        first; `warnings` gets what Compose warned of on its way to success."""
        verb = "up" if "up" in args else "down" if "down" in args else None
        try:
            code, stdout, stderr = await self.processes.finish(
                process, timeout=timeout, text=text, crash_point=f"compose.{verb}.running" if verb else None
            )
        except asyncio.TimeoutError:
            raise ComposeError(
                f"docker compose {args[0] if args else ''} did not finish within {timeout:.0f}s"
            ) from None
        if code != 0:
            raise ComposeError(await asyncio.to_thread(clean_error, stderr, cwd, self.docker_config_dir))
        if warnings is not None:
            warnings += await asyncio.to_thread(compose_warnings, stderr, cwd, self.docker_config_dir)
        return stdout

    async def _run(self, args: list[str], *, cwd: Path, timeout: float, warnings: list[str] | None = None) -> str:
        process = await self._start(args, cwd=cwd)
        return await self._finish(process, args, cwd=cwd, timeout=timeout, warnings=warnings)

    async def config(self, project: str, workdir: Path, compose_file: str, variables: dict[str, str]) -> dict:
        """Compose's normalised model of the file (see config_and_warnings)."""
        model, _ = await self.config_and_warnings(project, workdir, compose_file, variables)
        return model

    async def config_and_warnings(
        self, project: str, workdir: Path, compose_file: str, variables: dict[str, str]
    ) -> tuple[dict, list[str]]:
        """(Compose's normalised model of the file, interpolated with the
        template's variables, what Compose warned of while reading it). The
        variables are read from a private file that exists only while this
        call runs; the model then holds every value it needs. The warnings
        are for the renter (a variable not set, deployed as ""): see
        compose_warnings."""
        env_file = workdir / VARIABLES_FILE
        await asyncio.to_thread(write_variables, env_file, interpolation_variables(variables))
        warnings: list[str] = []
        try:
            output = await self._run(
                ["-p", project, "-f", compose_file, "--env-file", VARIABLES_FILE, "config", "--format", "json"],
                cwd=workdir,
                timeout=60,
                warnings=warnings,
            )
        finally:
            await asyncio.to_thread(env_file.unlink, missing_ok=True)
        try:
            model = json.loads(output)
        except ValueError:
            raise ComposeError("Compose could not turn the file into a project (its output was not JSON)") from None
        if not isinstance(model, dict):
            raise ComposeError("Compose could not turn the file into a project")
        return model, warnings

    async def start_up(self, project: str, workdir: Path) -> PendingUp:
        """`up` started now, reading its file from stdin: see PendingUp."""
        args = [
            "--progress",
            "quiet",
            "-p",
            project,
            "-f",
            "-",
            "up",
            "--detach",
            "--pull",
            "missing",
            "--remove-orphans",
        ]
        return PendingUp(self, await self._start(args, cwd=workdir, stdin=True), args, workdir)

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


class PendingUp:
    """A `compose up` started before its file exists: the process starts (a
    Go binary of 70 MB, about 30 ms before it reads anything) while the
    deployer runs `compose config` and the sandbox, and reads the hardened
    file from stdin only when `run` gives it. Until then it has read nothing
    and asked the engine for nothing, so `discard` (the policy refused the
    stack, or anything else failed first) leaves nothing behind; with `-f -`
    Compose resolves paths against its working directory, the stack's
    directory, exactly as it did for the file written there."""

    def __init__(self, runner: ComposeRunner, process: asyncio.subprocess.Process, args: list[str], workdir: Path):
        self.runner, self.process, self.args, self.workdir = runner, process, args, workdir

    async def run(self, file_text: str) -> None:
        await self.runner._finish(
            self.process, self.args, cwd=self.workdir, timeout=self.runner.up_timeout, text=file_text
        )

    async def discard(self) -> None:
        """Stop it if it is still waiting (or running); a finished one is left as it is."""
        await kill(self.process)

    async def __aenter__(self) -> PendingUp:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.discard()


def clean_error(stderr: str, workdir: Path, home: Path | None = None) -> str:
    """Compose's error lines, without the agent's paths and progress noise."""
    lines = [_warning_text(line.strip()) for line in stderr.splitlines() if line.strip()]
    lines = [line for line in lines if line and "attribute `version` is obsolete" not in line]
    wanted = [line for line in lines if not line.startswith(("Container ", "Network ", "Volume ", "Image "))] or lines
    text = " | ".join(wanted[-4:]) or "docker compose failed without a message"
    return renter_names(_without_paths(text, workdir, home))[:2000]


def _without_paths(text: str, workdir: Path, home: Path | None) -> str:
    """`text` with the stack's folder written `.` and the agent's DOCKER_CONFIG
    (Compose's `~`) written `~`: no path of the agent's reaches a renter."""
    for path in sorted({str(workdir), str(workdir.resolve())}, key=len, reverse=True):
        text = text.replace(path + os.sep, "").replace(path, ".")
    if home is not None:
        text = text.replace(str(home), "~")
    return text


MAX_WARNINGS = 8  # of one `config`, shown to the renter; the rest are counted
MAX_WARNING_CHARS = 300


def compose_warnings(stderr: str, workdir: Path, home: Path | None = None) -> list[str]:
    """What Compose warned of on a `config` that succeeded, for the renter's
    notices: a variable the file uses that the template does not set
    (deployed as an empty string, so a missing HF_TOKEN looks like the
    application's bug) and any other warning, save the obsolete `version:`
    one that every older file draws. The text quotes the renter's file, so
    each is made visible (common/visible.py), bounded, said once, without
    the agent's paths; at most MAX_WARNINGS, then how many more."""
    found: list[str] = []
    for line in stderr.splitlines():
        match = _LOGRUS_WARNING.match(line.strip())
        text = match.group(1).replace('\\"', '"') if match else ""
        if not text or "attribute `version` is obsolete" in text:
            continue
        text = visible(renter_names(_without_paths(text, workdir, home)))
        text = text if len(text) <= MAX_WARNING_CHARS else text[:MAX_WARNING_CHARS] + "..."
        if text not in found:
            found.append(text)
    if len(found) > MAX_WARNINGS:
        found[MAX_WARNINGS:] = [f"{len(found) - MAX_WARNINGS} more warning(s) of Compose not shown"]
    return found


_LOGRUS_WARNING = re.compile(r'^time="[^"]*" level=warning msg="(.*)"$')


def _warning_text(line: str) -> str:
    """Compose's `time=... level=warning msg="..."` lines, as their message
    (an unset variable is often why the file fails)."""
    match = _LOGRUS_WARNING.match(line)
    return match.group(1).replace('\\"', '"') if match else line

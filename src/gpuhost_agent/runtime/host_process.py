"""The one way the agent starts a host program that speaks to the engine:
Docker Compose (runtime/compose.py) and the docker CLI's `docker stack`
and `docker service` (runtime/swarm_stacks.py).

Every such process gets the same fixed environment (`host_environment`):
the agent's PATH and engine address, and the agent's own docker config
folder, nothing else. Compose's interpolation, and `docker stack deploy`'s,
read their environment, so the agent's own variables (its API key among
them) must not be there to be read; renters' pulls never use registry
credentials the host keeps in ~/.docker; and no renter-chosen name or value
ever becomes the environment of a host process (`LD_PRELOAD` and the like
would make the program load a library the renter planted, as root).

Every such process also dies with the agent (SIGKILL when its parent goes):
an agent that restarts must not race a Compose or a `docker stack deploy`
it left behind on the same project; the job is redone and converges
instead. setpriv is in util-linux, on every Debian and Ubuntu.

Every such program is Go, and a short-lived one: a Compose run spends most
of its CPU initialising a 70 MB binary, and Go's collector runs several
times during that start-up although almost nothing it allocates is garbage
yet. `GOGC=400` lets the heap grow to five times what is live before a
collection instead of twice: a `compose config` took 59 ms of CPU instead
of 81, an `up` 72 instead of 90, with the same peak memory (52 MiB), on this
project's machine. A deploy runs two, and twenty deploys at once are
CPU-bound on a small host.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from gpuhost_agent.common import crash_points

_PASSED_THROUGH = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")
GO_RUNTIME = {"GOGC": "400"}  # see the docstring: Go's collector, sized for a short-lived CLI
DIE_WITH_AGENT = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


def host_environment(docker_config_dir: Path | None) -> dict[str, str]:
    """The whole environment of a Compose or docker CLI process the agent
    starts: the agent's PATH and engine address, and its own docker config
    folder (also HOME, where Compose resolves `~`). Nothing of a stack."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **GO_RUNTIME}
    if docker_config_dir is not None:
        env.update(HOME=str(docker_config_dir), DOCKER_CONFIG=str(docker_config_dir))
    env.update({key: os.environ[key] for key in _PASSED_THROUGH if key in os.environ})
    return env


class HostProcesses:
    """Starts and finishes the agent's host programs, all with the same
    environment and the same end (see the module's docstring)."""

    def __init__(self, docker_config_dir: Path | None):
        self.docker_config_dir = docker_config_dir

    async def start(
        self, argv: list[str], *, cwd: Path | None = None, stdin: bool = False, merge_output: bool = False
    ) -> asyncio.subprocess.Process:
        """`argv` started now; with `stdin` it reads what `finish` gives it
        (and nothing before), with `merge_output` its stderr is its stdout.
        OSError when the program cannot run."""
        return await asyncio.create_subprocess_exec(
            *DIE_WITH_AGENT,
            *argv,
            cwd=None if cwd is None else str(cwd),
            env=host_environment(self.docker_config_dir),
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if merge_output else asyncio.subprocess.PIPE,
        )

    async def finish(
        self,
        process: asyncio.subprocess.Process,
        *,
        timeout: float,
        text: str | None = None,
        crash_point: str | None = None,
    ) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) once it exits; `text` is written to its
        stdin first. Past `timeout` it is killed and asyncio.TimeoutError
        raised; cancelled, it is killed too. `crash_point` names the fault
        the crash tests arm while the process runs (common/crash_points.py)."""
        communicating = asyncio.ensure_future(process.communicate(None if text is None else text.encode()))
        try:
            if crash_point and crash_points.armed(crash_point):
                await asyncio.sleep(0.5)
                crash_points.crash_point(crash_point)
            stdout, stderr = await asyncio.wait_for(communicating, timeout)
        except asyncio.TimeoutError:
            await kill(process)
            raise
        except asyncio.CancelledError:
            communicating.cancel()
            await kill(process)
            raise
        return process.returncode or 0, stdout.decode(errors="replace"), (stderr or b"").decode(errors="replace")


async def kill(process: asyncio.subprocess.Process) -> None:
    """Kill it if it still runs, and reap it."""
    if process.returncode is None:
        try:
            process.kill()
        except ProcessLookupError:
            pass
        await process.wait()

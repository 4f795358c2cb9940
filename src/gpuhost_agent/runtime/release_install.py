"""An offered release installed beside the running agent: a virtual
environment of its own under the state directory, the wheel in it, and the
new version asked for its version before anything trusts it.

The new environment is made by the installed agent's Python (the one
install.sh set up under /opt/gpuhost-agent/venv, the unit's `ExecStart`) and
reads that environment's packages after its own (a `.pth` file): the wheel
brings the agent's code, install.sh brought its dependencies. A release that
needs a dependency the host lacks fails its trial start and is rolled back; a
host installs those with install.sh. So before its trial the release's own
lock (gpuhost_agent/agent.lock in the wheel) is checked against that
environment: a release locked to other versions fails here, naming them,
instead of starting on dependencies it was not built with. pip runs with
`--isolated --no-index --no-deps`: it reads no configuration of the host's,
contacts no index, and installs exactly the file whose sha256 was checked.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

from gpuhost_agent.errors import OutsideFailure
from gpuhost_agent.runtime.host_process import kill

STEP_SECONDS = 300.0  # one step (venv, pip, version check) of an install
OUTPUT_KEPT = 2000  # characters of a failed step's output in its message
LOCK_CHECK = "gpuhost_agent.common.lock_check"  # run by the release's Python: its own copy


class InstallFailed(OutsideFailure):
    pass


def python_of(prefix: Path) -> Path:
    return prefix / "bin" / "python"


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


async def install(wheel: Path, version: str, folder: Path, base: Path) -> None:
    """The release in `wheel` installed as a virtual environment at `folder`,
    made from the installed agent's environment at `base`; InstallFailed
    (with what the failing step printed) otherwise, and nothing left at `folder`."""
    await asyncio.to_thread(shutil.rmtree, folder, True)
    try:
        await _step("making its virtual environment", str(python_of(base)), "-m", "venv", "--without-pip", str(folder))
        site = site_packages(folder)
        # An `import` line of a .pth runs at start-up: addsitedir also reads that folder's own .pth files.
        line = f"import site; site.addsitedir({str(site_packages(base))!r})\n"
        await asyncio.to_thread((site / "gpuhost-installed-agent.pth").write_text, line)
        await _step(
            "installing its wheel",
            str(python_of(base)), "-m", "pip", "--isolated", "--disable-pip-version-check",
            "--python", str(python_of(folder)),
            "install", "--no-deps", "--no-index", "--no-cache-dir", "--no-warn-script-location", str(wheel),
        )  # fmt: skip
        lock = site / "gpuhost_agent" / "agent.lock"
        try:
            await _step("checking its lock", str(python_of(folder)), "-m", LOCK_CHECK, str(lock))
        except InstallFailed as exc:
            raise InstallFailed(f"{exc.args[0]} (install.sh installs a release with its lock)") from None
        said = await _step("asking its version", str(folder / "bin" / "gpuhost-agent"), "version")
        if said.strip() != version:
            raise InstallFailed(f"the installed release says it is version {said.strip()[:80]!r}, not {version}")
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, folder, True)
        raise


async def _step(what: str, *argv: str) -> str:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONNOUSERSITE": "1"}
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=env,
        )  # fmt: skip
    except OSError as exc:
        raise InstallFailed(f"{what}: {exc}") from exc
    try:
        out, _ = await asyncio.wait_for(process.communicate(), STEP_SECONDS)
    except asyncio.TimeoutError:
        await kill(process)
        raise InstallFailed(f"{what}: no end within {STEP_SECONDS:.0f} s") from None
    text = out.decode("utf-8", "replace")
    if process.returncode != 0:
        raise InstallFailed(f"{what} failed (exit {process.returncode}): {text[-OUTPUT_KEPT:]}")
    return text

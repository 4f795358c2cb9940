"""The release the installation line installs: install.sh asks for
it at `GET /v1/agent/release`, checks its signature with the key the line
pinned, and installs that wheel and the locks inside it, never a name on the
package index. It is the release offered for upgrades when there is one
(GPUHOST_LOCAL_RELEASE_WHEEL), else a wheel of the checkout this marketplace
runs from, built once, on the first request (pip wheel: seconds), into the
marketplace's own folder.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from gpuhost_agent.local_marketplace.releases import Release

BUILD_SECONDS = 300


def running_checkout() -> Path | None:
    """The checkout this package runs from, if any (none for an installed wheel)."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").is_file() and (root / "src" / "gpuhost_agent").is_dir() else None


def build_wheel(checkout: Path, out: Path) -> Path:
    """A wheel of `checkout` in `out` (emptied first); RuntimeError with pip's words."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps"]
    command += ["--no-build-isolation", "--no-index", "--wheel-dir", str(out), str(checkout)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_SECONDS, stdin=subprocess.DEVNULL)
    wheels = sorted(out.glob("gpuhost_agent-*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        said = (done.stderr or done.stdout).strip()[-500:]
        raise RuntimeError(f"building the agent's wheel from {checkout} failed: {said or 'no wheel written'}")
    return wheels[0]


class InstallRelease:
    """The release to install, found or built once (concurrent askers wait on one build)."""

    def __init__(self, offered: Callable[[], Release | None], checkout: Path | None, build_dir: Path) -> None:
        self._offered = offered
        self._checkout = checkout
        self._build_dir = build_dir
        self._built: Release | None = None
        self._building = asyncio.Lock()

    async def release(self) -> Release:
        """LookupError saying why when there is none to install."""
        offered = self._offered()
        if offered is not None:
            return offered
        async with self._building:
            if self._built is None:
                if self._checkout is None:
                    raise LookupError(
                        "this marketplace has no release to install: it runs from an installed agent, "
                        "not a checkout; set GPUHOST_LOCAL_RELEASE_WHEEL to an agent wheel"
                    )
                wheel = await asyncio.to_thread(build_wheel, self._checkout, self._build_dir)
                self._built = await asyncio.to_thread(Release.of_wheel, wheel)
            return self._built

    def wheel(self, name: str) -> Path | None:
        """The wheel called `name`, when it is the release to install."""
        for release in (self._offered(), self._built):
            if release is not None and release.wheel.name == name:
                return release.wheel
        return None

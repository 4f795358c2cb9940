"""Releases of the agent for the upgrade tests, made from the wheel of this
checkout (the agent_wheels fixture): the same code under another version, or
with a fault added at the end of one module (a crash at start, a version that
never becomes healthy). The wheel is rewritten as a zip, its RECORD's hashes
made again, so pip installs it as it would a published one."""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path

# Appended to gpuhost_agent/service/daemon.py: the new version dies as it starts.
CRASH_AT_START = "\nraise RuntimeError('this release crashes at start (an upgrade test)')\n"
# Appended to gpuhost_agent/core/agent.py: the new version runs, pings systemd's
# watchdog, and never opens a session (so never passes its health check).
NEVER_HEALTHY = """

async def _never_opens_a_session(self) -> None:
    import asyncio

    await asyncio.Event().wait()


Agent._open_session = _never_opens_a_session
"""


def agent_wheel(wheels: Path) -> Path:
    (wheel,) = wheels.glob("gpuhost_agent-*.whl")
    return wheel


def variant(wheel: Path, out: Path, version: str, appended: dict[str, str] | None = None) -> Path:
    """A copy of `wheel` as `version`, with `appended` text added to the
    modules it names (paths inside the wheel)."""
    appended = appended or {}
    old = re.match(r"gpuhost_agent-([^-]+)-", wheel.name)
    assert old, wheel.name
    old_version = old.group(1)
    target = out / wheel.name.replace(f"-{old_version}-", f"-{version}-")
    out.mkdir(parents=True, exist_ok=True)
    old_info, new_info = f"gpuhost_agent-{old_version}.dist-info/", f"gpuhost_agent-{version}.dist-info/"
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as source:
        for name in source.namelist():
            body = source.read(name)
            if name.startswith(old_info):
                name = new_info + name[len(old_info) :]
            if name == new_info + "METADATA":
                body = re.sub(rb"(?m)^Version: .*$", f"Version: {version}".encode(), body, count=1)
            if name == "gpuhost_agent/__init__.py":
                body = re.sub(rb'__version__ = "[^"]*"', f'__version__ = "{version}"'.encode(), body)
            if name in appended:
                body += appended.pop(name).encode()
            files[name] = body
    assert not appended, f"not in the wheel: {sorted(appended)}"
    record = new_info + "RECORD"
    lines = [f"{name},sha256={_digest(body)},{len(body)}" for name, body in files.items() if name != record]
    files[record] = ("\n".join([*lines, f"{record},,"]) + "\n").encode()
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as made:
        for name, body in files.items():
            made.writestr(name, body)
    return target


def _digest(body: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()

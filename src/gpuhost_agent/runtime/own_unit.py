"""The agent's own systemd unit, for an upgrade's restart: its name, and a
restart by a job (`systemctl --no-block restart`), as an operator's
`systemctl restart` would do it. A restart by job starts the new version at
once and clears systemd's count of automatic restarts, whose back-off
(install.sh's RestartSteps=, up to 5 min) is for crashes, not for upgrades;
a crash of the new version is then one automatic restart after RestartSec=.

Apart from runtime/rental_slices.py (the rentals' slices, systemd's cgroup
API) because this is the lifecycle of the agent's own service.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuhost_agent.runtime.host_process import kill

COMMAND_SECONDS = 30.0


def unit_name(cgroup_file: Path = Path("/proc/self/cgroup")) -> str | None:
    """The .service whose cgroup this process is in, None outside one."""
    try:
        text = cgroup_file.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split(":", 2)
        last = parts[-1].rstrip("/").rsplit("/", 1)[-1]
        if len(parts) == 3 and last.endswith(".service"):
            return last
    return None


async def restart(unit: str) -> str | None:
    """The restart job queued (None), or why not."""
    try:
        process = await asyncio.create_subprocess_exec(
            "systemctl", "--no-block", "restart", unit,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    except OSError as exc:
        return f"systemctl: {exc}"
    try:
        out, _ = await asyncio.wait_for(process.communicate(), COMMAND_SECONDS)
    except asyncio.TimeoutError:
        await kill(process)
        return f"systemctl restart {unit}: no answer within {COMMAND_SECONDS:.0f} s"
    if process.returncode != 0:
        return f"systemctl restart {unit}: {out.decode('utf-8', 'replace').strip()[:300]}"
    return None

"""An installed environment read back against a lock (gpuhost_agent.common.lock_check):
`DUMP` runs with that environment's Python (on a test host, in a chroot) and
prints its Python version and distributions; `differences` compares them with
the lock's pins for that Python and returns the lines that differ."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENT_LOCK = ROOT / "requirements" / "agent.lock"
DUMP = (
    "import json, platform, importlib.metadata as m; "
    "print(json.dumps({'python': platform.python_version(), "
    "'installed': {d.metadata['Name']: d.version for d in m.distributions()}}))"
)


def differences(dumped: str, lock: Path = AGENT_LOCK) -> list[str]:
    """What lock_check says differs ([] when every locked package is installed at its version)."""
    seen = json.loads(dumped)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as installed:
        json.dump(seen["installed"], installed)
        installed.flush()
        checked = subprocess.run(
            [sys.executable, "-m", "gpuhost_agent.common.lock_check", str(lock), "--installed", installed.name,
             "--python", seen["python"]],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert checked.returncode in (0, 1), checked.stderr
    return checked.stderr.splitlines() if checked.returncode else []

"""`gpuhost-agent run` as a real process, without an engine: a bad configuration
exits at once with a message that says what to fix. (Deploying and stopping:
tests/integration/test_daemon_engine.py.)"""

from __future__ import annotations

import os
import subprocess
import sys


def test_bad_configuration_exits_with_a_clear_message(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "gpuhost_agent", "run", "--marketplace-url", "https://m.example/v1"],
        capture_output=True,
        text=True,
        env={**os.environ, "GPUHOST_CONFIG": ""},
        timeout=30,
    )
    assert done.returncode == 2
    assert "GPUHOST_ENV_ID" in done.stderr and "GPUHOST_API_KEY" in done.stderr

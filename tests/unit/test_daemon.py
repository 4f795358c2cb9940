"""`gpuhost-agent run` as a real process, without an engine: a bad configuration
exits at once with a message that says what to fix. (Deploying and stopping:
tests/integration/test_daemon_engine.py.)"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


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
    level = subprocess.run(
        [sys.executable, "-m", "gpuhost_agent", "run", "--log-level", "loud", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "GPUHOST_CONFIG": ""},
        timeout=30,
    )
    assert level.returncode == 2 and "Traceback" not in level.stderr, level.stderr
    assert "configuration error: unknown log level 'loud' (use debug, info, warning or error)" in level.stderr


def test_a_state_directory_holds_one_agent(tmp_path):
    from gpuhost_agent.service.state_lock import StateInUse, StateLock

    first, second = StateLock(tmp_path), StateLock(tmp_path)
    first.take()
    try:
        second.take()
    except StateInUse as refused:
        assert f"(pid {os.getpid()})" in str(refused) and "--state-dir" in str(refused)
    else:
        raise AssertionError("two agents took one state directory")
    first.release()
    second.take()  # free again once the first let go (or died: the kernel drops the lock)
    second.release()


def test_a_second_agent_on_the_same_state_says_so_before_its_banner(tmp_path):
    """A second agent found out only at the status socket, after it had
    printed the local marketplace's banner and opened a session."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUHOST_")}
    (tmp_path / "none.conf").write_text("# empty: no marketplace, the local one\n")
    env["GPUHOST_CONFIG"] = str(tmp_path / "none.conf")
    command = [sys.executable, "-m", "gpuhost_agent", "run", "--state-dir", str(tmp_path / "state")]
    command += ["--local-listen", "127.0.0.1:0", "--log-level", "warning"]
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert first.stdout is not None
        banner = "".join(first.stdout.readline() for _ in range(6))
        assert f"state directory: {tmp_path / 'state'}" in banner, banner
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
    finally:
        first.terminate()
        first.wait(60)
    assert second.returncode == 1
    assert f"another gpuhost-agent (pid {first.pid}) runs on the state directory" in second.stderr
    # How to stop it, as it was started: not systemctl for an agent outside systemd
    assert f"stop it first (kill {first.pid}: it stops as systemd stops it)" in second.stderr, second.stderr
    assert "base URL" not in second.stdout


def test_the_banner_prints_a_status_command_that_reads_this_agent(tmp_path):
    """A plain `gpuhost-agent status` looks in the system
    service's state directory and said "not running" while `make run` ran. The
    banner's command reads this agent; and `status` with nothing named, run in
    the checkout, finds `make run`'s state/ and says which socket it read."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUHOST_")}
    (tmp_path / "none.conf").write_text("# empty: no marketplace, the local one\n")
    env["GPUHOST_CONFIG"] = str(tmp_path / "none.conf")
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg")  # a non-root user's default: empty here
    command = [sys.executable, "-m", "gpuhost_agent", "run", "--state-dir", str(tmp_path / "state")]
    command += ["--local-listen", "127.0.0.1:0", "--log-level", "warning"]
    agent = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert agent.stdout is not None
        banner = ""
        while "  try: curl" not in banner:  # the banner's last line
            banner += agent.stdout.readline()
        (line,) = [line for line in banner.splitlines() if line.startswith("  status:")]
        printed = shlex.split(line.split(":", 1)[1])
        assert printed[-3:] == ["status", "--state-dir", str(tmp_path / "state")], banner
        deadline = time.monotonic() + 30
        while (done := subprocess.run(printed, env=env, capture_output=True, text=True, timeout=30)).returncode:
            assert time.monotonic() < deadline and done.returncode == 3, done.stderr  # until its socket listens
            time.sleep(0.2)
        assert "running (pid" in done.stdout and str(agent.pid) in done.stdout, done.stdout
        plain = [sys.executable, "-m", "gpuhost_agent", "status"]
        found = subprocess.run(plain, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert found.returncode == 0 and str(agent.pid) in found.stdout, found.stderr
        assert f"this is the development agent at {tmp_path / 'state' / 'agent.sock'}" in found.stderr
    finally:
        agent.terminate()
        agent.wait(60)
    if not (CHECKOUT / "state" / "agent.sock").exists():  # a developer's own `make run` would answer
        gone = subprocess.run(plain, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert gone.returncode == 3 and "nor a development agent's (make run) at" in gone.stderr, gone.stderr


def test_doctor_shows_the_running_agents_settings_and_says_whose(tmp_path):
    """doctor showed its own view of the settings (GPUHOST_LOG_LEVEL info, default) while
    the agent it should diagnose ran with others: it reads the running agent's
    over the status socket, and says whose it shows."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUHOST_")}
    (tmp_path / "none.conf").write_text("# empty: no marketplace, the local one\n")
    env["GPUHOST_CONFIG"] = str(tmp_path / "none.conf")
    state = ["--state-dir", str(tmp_path / "state")]
    agent = [sys.executable, "-m", "gpuhost_agent", "run", *state, "--local-listen", "127.0.0.1:0"]
    doctor = [sys.executable, "-m", "gpuhost_agent", "doctor", *state, "--json"]

    def settings_shown() -> tuple[str, dict]:
        done = subprocess.run(doctor, env=env, capture_output=True, text=True, timeout=120)
        shown = json.loads(done.stdout)
        return shown["settingsOf"], {row["setting"]: row for row in shown["settings"]}

    first = subprocess.Popen(
        [*agent, "--log-level", "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert first.stdout is not None
        "".join(first.stdout.readline() for _ in range(6))  # the banner; its socket listens a moment later
        deadline, shown = time.monotonic() + 60, settings_shown()
        while "running agent" not in shown[0] and time.monotonic() < deadline:
            time.sleep(0.2)
            shown = settings_shown()
        whose, rows = shown
    finally:
        first.terminate()
        first.wait(60)
    assert f"running agent (pid {first.pid}" in whose, whose
    assert (rows["GPUHOST_LOG_LEVEL"]["value"], rows["GPUHOST_LOG_LEVEL"]["source"]) == ("warning", "flag")
    whose, rows = settings_shown()  # none runs now: doctor's own, and it says so
    assert "doctor reads itself (no agent answers" in whose and rows["GPUHOST_LOG_LEVEL"]["value"] == "info"

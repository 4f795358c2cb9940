"""The launcher (service/launcher.py) with real processes: it execs the
chosen version in place, leaves a guardian that stops a trial not confirmed
within its bound, and rolls back at the next start. The "versions" here are
shell scripts standing in for an installed agent's bin/gpuhost-agent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpuhost_agent.core import upgrade_plan
from gpuhost_agent.protocol import wire_time
from gpuhost_agent.protocol.wire_release import ROLLED_BACK, ReleaseOffer
from gpuhost_agent.storage import upgrade_state

SHA = "ef" * 32
AGENT = """#!/bin/sh
echo "started from=$GPUHOST_LAUNCHED_FROM args=$*" >> "$SAID"
trap 'echo TERM >> "$SAID"; exit 0' TERM
while :; do sleep 0.05; done
"""
LAUNCH = (
    "import sys; from pathlib import Path; from gpuhost_agent.service import launcher; "
    "launcher.launch(Path(sys.argv[1]), ['run', '--config', '/etc/x.conf']); print('the installed version runs')"
)


def _version(state: Path, name: str) -> Path:
    prefix = state / upgrade_state.VERSIONS / name
    (prefix / "bin").mkdir(parents=True)
    agent = prefix / "bin" / "gpuhost-agent"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    return prefix


def _on_trial(state: Path, prefix: Path, seconds: float) -> None:
    offer = ReleaseOffer("0.2.0", "/agent/releases/x.whl", SHA, 1)
    upgrade_state.save(state, upgrade_plan.trial(upgrade_state.empty(), offer, str(prefix), seconds, wire_time.iso()))


def _launch(state: Path, said: Path, *, systemd: bool = True) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "GPUHOST_LAUNCHED_FROM")}
    env["SAID"] = str(said)
    if systemd:
        env["NOTIFY_SOCKET"] = "/run/systemd/notify-stand-in"
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCH, str(state)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_trial_not_confirmed_in_time_is_stopped_and_rolled_back_at_the_next_start(tmp_path: Path) -> None:
    state, said = tmp_path / "state", tmp_path / "said"
    state.mkdir()
    prefix = _version(state, "0.2.0")
    _on_trial(state, prefix, 0.5)
    launched = _launch(state, said)
    out, err = launched.communicate(timeout=20)  # the guardian's SIGTERM ends it
    assert "the installed version runs" not in out  # exec'd: the launcher's own code never went on
    lines = said.read_text().splitlines()
    assert lines == [f"started from={sys.prefix} args=run --config /etc/x.conf", "TERM"], (lines, err)
    assert "did not pass its health check" in err and "within 0.5 s" in err
    trial = upgrade_state.load(state)["trial"]
    assert trial["starts"] == 1 and "within 0.5 s" in trial["failure"]

    again = _launch(state, said)  # systemd starts the unit again
    out, err = again.communicate(timeout=20)
    assert "the installed version runs" in out and "rolled back" in err
    record = upgrade_state.load(state)
    assert record["trial"] is None and record["lastAttempt"]["outcome"] == ROLLED_BACK
    assert "within 0.5 s" in record["lastAttempt"]["reason"]
    assert said.read_text().count("started") == 1
    assert not prefix.exists()  # the rolled-back version's folder goes


def test_a_confirmed_trial_is_left_running_by_its_guardian(tmp_path: Path) -> None:
    state, said = tmp_path / "state", tmp_path / "said"
    state.mkdir()
    prefix = _version(state, "0.2.0")
    _on_trial(state, prefix, 1.0)
    launched = _launch(state, said)
    try:
        deadline = time.monotonic() + 10
        while not said.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with upgrade_state.locked(state):  # what the new version does once healthy
            confirmed = upgrade_plan.confirmed(upgrade_state.load(state), str(prefix), "now")
            assert confirmed is not None
            upgrade_state.save(state, confirmed)
        time.sleep(2.0)  # past the bound
        assert launched.poll() is None and "TERM" not in said.read_text()
    finally:
        launched.send_signal(signal.SIGTERM)
        launched.communicate(timeout=10)
    assert upgrade_state.load(state)["current"]["prefix"] == str(prefix)


def test_outside_systemd_the_launcher_runs_itself_and_changes_nothing(tmp_path: Path) -> None:
    state, said = tmp_path / "state", tmp_path / "said"
    state.mkdir()
    _on_trial(state, _version(state, "0.2.0"), 0.5)
    before = upgrade_state.load(state)
    out, _ = _launch(state, said, systemd=False).communicate(timeout=20)
    assert "the installed version runs" in out and not said.exists()
    assert upgrade_state.load(state) == before


def test_a_chosen_version_whose_folder_is_gone_falls_back_to_the_installed_one(tmp_path: Path) -> None:
    state, said = tmp_path / "state", tmp_path / "said"
    state.mkdir()
    record = {**upgrade_state.empty(), "current": {"version": "0.2.0", "prefix": str(tmp_path / "gone")}}
    upgrade_state.save(state, record)
    out, err = _launch(state, said).communicate(timeout=20)
    assert "the installed version runs" in out and "is gone" in err
    assert upgrade_state.load(state)["current"] is None

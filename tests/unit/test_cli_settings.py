"""The command line's flags are made from the settings' declarations:
`gpuhost-agent run --help`, from the real program, names every setting's flag
and variable with its default, and each flag sets its setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhost_agent.service import cli, config, daemon
from gpuhost_agent.service.settings_table import SETTINGS

SRC = str(Path(cli.__file__).parents[2])


def _help(command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gpuhost_agent", command, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC, "COLUMNS": "100"},
        timeout=30,
        check=True,
    )
    return " ".join(done.stdout.split())  # argparse wraps lines; a default may span two


@pytest.mark.parametrize("command", ["run", "doctor", "support-bundle"])
def test_help_names_every_settings_flag_variable_and_default(command):
    text = _help(command)
    for setting in SETTINGS:
        assert f"{setting.option} " in text, setting.option
        assert f"({setting.env};" in text, setting.env
        default = " ".join(setting.default_text().split())
        assert f"default: {default};".replace("- ", "-") in text.replace("- ", "-"), (setting.env, default)
        if setting.unit:
            assert f"; {setting.unit};" in text, (setting.env, setting.unit)


def test_status_reads_its_few_settings_under_their_old_flags():
    text = _help("status")
    assert "--socket " in text and "(GPUHOST_STATUS_SOCKET;" in text and "--state-dir " in text


def test_each_flag_sets_its_setting(tmp_path, monkeypatch):
    """What --help promises: a flag for each setting, read as that setting."""
    seen: dict[str, object] = {}

    def fake_run(loaded, reload=None, settings=None):
        seen.update(vars(loaded))
        return 0

    monkeypatch.setattr(daemon, "run", fake_run)
    monkeypatch.setenv("GPUHOST_CONFIG", "")
    argv = ["run", "--state-dir", str(tmp_path), "--pids-limit", "77", "--swarm", "leader", "--metrics", "on"]
    argv += ["--disk-floor", "1g", "--swarm-workers", "n1=10.0.0.2:7072", "--speed-max-bytes", "1000"]
    assert cli.main(argv) == 0
    assert (seen["pids_limit"], seen["swarm"], seen["metrics"], seen["disk_floor_bytes"]) == (
        77,
        "leader",
        True,
        1024**3,
    )
    assert seen["swarm_workers"] == {"n1": ("10.0.0.2", 7072)} and seen["speed_max_bytes"] == 1000
    flags = {setting.name for setting in SETTINGS}
    parsed = vars(cli._parser().parse_args(["run"]))
    assert flags <= set(parsed), flags - set(parsed)
    assert config.load({key: value for key, value in parsed.items() if key != "command"}, environ={})

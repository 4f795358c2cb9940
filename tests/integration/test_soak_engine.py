"""The soak (bench/soak.py), short: 40 cycles of create -> APPLIED (or ERROR)
-> remove -> gone through the local marketplace and a separate agent process
on the real engine, judged by the same bounds as the full 2000-cycle run
(`make soak`): no growth of the agent's memory, open files, threads and
asyncio tasks after warm-up, its database bounded, nothing left in Docker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_short_soak_stays_flat_and_leaves_nothing(tmp_path) -> None:
    result_file = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, "bench/soak.py", "--cycles", "40", "--warmup", "20", "--every", "5"]
        + ["--json", str(result_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result_file.exists(), done.stdout + done.stderr
    result = json.loads(result_file.read_text())
    assert result["verdicts"] and all(result["verdicts"].values()), done.stdout
    assert result["judgedFrom"] == 20  # growth counts from the warm-up's end, not from the first sample
    assert done.returncode == 0, done.stdout + done.stderr
    # Every kind of cycle ran as meant: deploys, failures, the policy's refusals, streams.
    outcomes = result["outcomes"]
    assert outcomes["one APPLIED"] and outcomes["three APPLIED"] and outcomes["streams APPLIED"], outcomes
    assert outcomes["fails ERROR"] and outcomes["refused ERROR"], outcomes
    assert [sample["cycle"] for sample in result["samples"]] == [5, 10, 15, 20, 25, 30, 35, 40]

"""docs/swarm.md's "Trying it on one machine", run as an operator pastes it:
its two bash blocks in one bash process, on the shared
test Swarm, as test_readme_blocks.py runs the README's.

Rewritten only where a test must: `swarm-cluster.sh up 2` and `down` are left
out (the session's cluster is up: tests/integration/conftest.py), the leader
runs in the background with its output kept (a reader watches it in the
foreground and stops it with Ctrl-C: here SIGINT), the fixed paths under /tmp
and the two fixed ports become the test's own. Between the blocks the leader's
local marketplace is asked what the document says it shows: `totalGPUs: 4`,
and machine 2's own report with its two GPUs, which its worker reads only
with the settings the document once left out (GPUHOST_NVML_LIBRARY,
FAKE_NVML_CONFIG, GPUHOST_GPU_CHECK_IMAGE). Both agents then stop without a
traceback (the door's relay ended quietly)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.ssh_clients import free_port

from gpuhost_agent.protocol import wire

pytestmark = pytest.mark.swarm

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.DOTALL | re.MULTILINE)
LEFT_OUT = ("bash scripts/swarm-cluster.sh up 2", "bash scripts/swarm-cluster.sh down")
LEADER_RUN = "  .venv/bin/gpuhost-agent run\n"


def doc_blocks(tmp: Path, leader_port: int, worker_port: int) -> tuple[str, str]:
    first, second = BLOCK.findall((ROOT / "docs" / "swarm.md").read_text())
    assert first.endswith(LEADER_RUN) and first.count("127.0.0.1:7072") == 2, "the document's commands changed"
    first = first.removesuffix(LEADER_RUN) + f'  .venv/bin/gpuhost-agent run >"{tmp}/leader.log" 2>&1 &\n'
    first = first.replace("run &\n", f'run >"{tmp}/worker.log" 2>&1 &\n', 1)  # the worker's output, kept
    blocks = []
    for block in (first, second):
        lines = [line for line in block.splitlines() if line.strip() not in LEFT_OUT]
        block = "\n".join(lines) + "\n"
        block = block.replace("/tmp/gpuhost-swarm-", f"{tmp}/gpuhost-swarm-")
        block = block.replace("127.0.0.1:8788", f"127.0.0.1:{leader_port}")
        blocks.append(block.replace("127.0.0.1:7072", f"127.0.0.1:{worker_port}"))
    return blocks[0], blocks[1]


def _get(port: int, key: str, path: str) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1{path}", headers={wire.API_KEY_HEADER: key})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def _machine_two(port: int, key: str) -> tuple[int, list[str]] | None:
    """(the listing's totalGPUs, machine 2's own GPUs) once the leader reported both."""
    try:
        (environment,) = _get(port, key, "/environments")
        env = f"/environments/{environment['envId']}"
        listing, described = _get(port, key, f"{env}/listing"), _get(port, key, env)
        nodes = described["systemData"]["environment"]["nodes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    reports = [report for node in nodes if (report := (node.get("machine") or {}).get("systemData"))]
    if not reports:  # the leader's own machine is {"this": true}; machine 2's comes from its worker
        return None
    return int(listing["totalGPUs"]), [gpu["uuid"] for gpu in reports[0]["nvml"]["gpus"]]


def test_the_documents_two_machines_run_as_pasted(shared_swarm, tmp_path) -> None:
    leader_port, worker_port, key = free_port(), free_port(), "doc-" + secrets.token_hex(8)
    first, second = doc_blocks(tmp_path, leader_port, worker_port)
    script = tmp_path / "swarm-doc.sh"
    wait = (
        f"for _ in $(seq 240); do grep -q 'renter API key' {tmp_path}/leader.log && break; sleep 0.5; done\n"
        'echo "DOC-READY"\n'
        "read -r _\n"  # the test asks the marketplace, then says go on
        "kill -INT %2; wait %2\n"  # Ctrl-C in the leader's terminal
    )
    script.write_text("set -u\nexport GPUHOST_LOCAL_API_KEY=" + key + "\n" + first + wait + second + "wait\n")
    shell = subprocess.Popen(
        ["bash", str(script)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its agents in its process group: ended with it if the test fails
    )
    try:
        assert shell.stdout is not None and shell.stdin is not None
        printed = []  # what the first block's commands print, then the leader's banner is in its log
        while (line := shell.stdout.readline()) and line.strip() != "DOC-READY":
            printed.append(line)
        assert line, printed  # the shell ended before the leader printed its banner (its stderr: below)
        deadline = time.monotonic() + 120
        seen = None
        while (seen := _machine_two(leader_port, key)) is None or seen[0] != 4:
            assert time.monotonic() < deadline, (seen, (tmp_path / "worker.log").read_text())
            time.sleep(1)
        total, gpus = seen
        assert total == 4 and len(gpus) == 2, seen  # machine 2's own NVML: its two stand-in GPUs
        shell.stdin.write("go\n")
        shell.stdin.flush()
        shell.wait(90)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGINT)  # the agents' own stop, then whatever is left
            time.sleep(10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)
            shell.wait(30)
    assert shell.returncode == 0, shell.stderr.read() if shell.stderr else ""
    leader, worker = (tmp_path / "leader.log").read_text(), (tmp_path / "worker.log").read_text()
    assert "agent_stopped" in leader and "swarm_worker_stopped" in worker, (leader, worker)
    for log in (leader, worker):
        assert "Traceback" not in log and "CancelledError" not in log, log

"""`gpuhost-agent run` as a real process: banner, deploy, SIGTERM leaves containers running.
(A bad configuration: tests/unit/test_daemon.py.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from support.engine import remove_env_resources
from support.stacks import TEST_IMAGE

from gpuhost_agent.protocol import wire

SECRET = "s3cret-model-token-value"


def _call(base: str, key: str, method: str, path: str, body=None):
    request = urllib.request.Request(
        base + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={wire.API_KEY_HEADER: key, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_daemon_runs_local_marketplace_and_stops_cleanly(tmp_path, docker_client):
    env = {**os.environ, "GPUHOST_LOCAL_API_KEY": "daemon-test-key", "GPUHOST_CONFIG": str(tmp_path / "none.conf")}
    (tmp_path / "none.conf").write_text("GPUHOST_SETTLE_SECONDS=0.5\n")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuhost_agent",
            "run",
            "--state-dir",
            str(tmp_path / "state"),
            "--local-listen",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "stderr", "w"),
        text=True,
        env=env,
    )
    env_id = None
    try:
        banner = "".join(process.stdout.readline() for _ in range(4))
        base = re.search(r"base URL:\s+(\S+)", banner).group(1)
        env_id = re.search(r"environment id:\s+(\S+)", banner).group(1)
        assert "renter API key:  daemon-test-key" in banner
        key = "daemon-test-key"
        rental = _call(base, key, "POST", "/rentals", {"envId": env_id})
        template = {
            "name": "daemon",
            "description": "",
            "environmentVariables": {"TOKEN": SECRET},
            "content": f"services:\n  app:\n    image: {TEST_IMAGE}\n    command: ['sleep', '3600']\n"
            "    environment:\n      TOKEN: ${TOKEN}\n",
        }
        stack_id = _call(base, key, "POST", f"/rentals/{rental['rentalId']}/stacks", {"template": template})
        deadline = time.monotonic() + 30
        while (status := _call(base, key, "GET", f"/rentals/{rental['rentalId']}/stacks")[0]["status"]) != wire.APPLIED:
            assert status == wire.APPLYING and time.monotonic() < deadline, status
            time.sleep(0.1)

        time.sleep(1)  # let the settle watch end so the job completes
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        (container,) = docker_client.containers.list(filters={"label": f"{wire.LABEL_STACK}={stack_id}"})
        assert container.status == "running", "renters' containers outlive the agent"
        assert f"TOKEN={SECRET}" in container.attrs["Config"]["Env"]
        stderr = (tmp_path / "stderr").read_text()
        events = [json.loads(line)["event"] for line in stderr.splitlines()]
        assert "stack_applied" in events and events[-1] == "agent_stopped"
        assert SECRET not in stderr and "daemon-test-key" not in stderr
    finally:
        if process.poll() is None:
            process.kill()
        if env_id:
            remove_env_resources(docker_client, env_id)


def test_killing_make_run_stops_its_agent(tmp_path):
    """`kill <pid of make run>` (SIGTERM, as timeout or a supervisor sends it) stopped make and
    left the agent running, reparented to PID 1, holding the port and the state."""
    import psutil

    root = Path(__file__).resolve().parents[2]
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUHOST_")}
    (tmp_path / "none.conf").write_text("GPUHOST_SETTLE_SECONDS=0.5\n")
    env["GPUHOST_CONFIG"] = str(tmp_path / "none.conf")
    state = tmp_path / "state"
    args = f"ARGS=--state-dir {state} --local-listen 127.0.0.1:0"
    make = subprocess.Popen(
        ["make", "-s", "run", args], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    agents: list = []
    try:
        deadline = time.monotonic() + 300  # make run sets up first (fast once done)
        while "base URL" not in make.stdout.readline():
            assert time.monotonic() < deadline and make.poll() is None, "make run printed no banner"
        agents = psutil.Process(make.pid).children(recursive=True)
        assert [agent.name() for agent in agents] == ["gpuhost-agent"], agents
        make.send_signal(signal.SIGTERM)
        make.wait(timeout=30)
        gone, alive = psutil.wait_procs(agents, timeout=30)
        assert not alive, f"the agent outlived make: {alive}"
    finally:
        if make.poll() is None:
            make.kill()
        for agent in agents:
            if agent.is_running():
                agent.kill()
    from gpuhost_agent.service.state_lock import StateLock

    lock = StateLock(state)
    lock.take()  # free: the agent stopped and let it go
    lock.release()

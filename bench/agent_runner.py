"""The agent of bench/tunnel.py, in the bench's own process (as `gpuhost-agent
run` wires it with the local marketplace) or as a separate `gpuhost-agent run`
process against the bench's marketplace.

In production the marketplace and the agent are different machines: the
separate process gives each relay its own core on a 2-core machine, which is
closer to that than one event loop carrying both ends of every byte.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from gpuhost_agent.service.daemon import stop_agent
from gpuhost_agent.service.wiring import build_agent


class InProcessAgent:
    """The agent on the bench's event loop, beside the marketplace."""

    def __init__(self, config, local):
        self.parts = build_agent(config, local.base_url, local.state.store.envApiKey)
        self.task: asyncio.Task | None = None
        self.pids = [os.getpid()]

    async def start(self) -> None:
        self.task = asyncio.create_task(self.parts.agent.run(), name="agent")
        await asyncio.wait_for(self.parts.session.connected.wait(), 30)

    async def stop(self) -> None:
        if self.task is not None:
            await stop_agent(self.parts, self.task)


class SeparateAgent:
    """`python -m gpuhost_agent run` with a config file naming the bench's
    marketplace; its log goes to agent.log in the work directory. `settings`
    adds to or overrides the config file's GPUHOST_* lines."""

    def __init__(self, config, local, workdir: Path, settings: dict[str, str] | None = None):
        self.local, self.workdir = local, workdir
        store = local.state.store
        key_file = workdir / "env-api-key"
        key_file.write_text(store.envApiKey)
        key_file.chmod(0o600)
        lines = {
            "GPUHOST_MARKETPLACE_URL": local.base_url,
            "GPUHOST_ENV_ID": store.envId,
            "GPUHOST_API_KEY_FILE": str(key_file),
            "GPUHOST_STATE_DIR": str(workdir / "agent-state"),
            "GPUHOST_SETTLE_SECONDS": str(config.settle_seconds),
            "GPUHOST_STOP_TIMEOUT": str(config.stop_timeout),
            "GPUHOST_LOG_LEVEL": "warning",
        } | (settings or {})
        self.config_file = workdir / "agent.conf"
        self.config_file.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
        self.process: asyncio.subprocess.Process | None = None
        self.pids: list[int] = [os.getpid()]

    async def start(self) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith("GPUHOST_")}
        env["GPUHOST_CONFIG"] = str(self.config_file)
        log = await asyncio.to_thread(open, self.workdir / "agent.log", "wb")
        # A bench killed without its cleanup must not leave the agent running on:
        # it gets SIGTERM when the bench dies (and stops as under systemd).
        dies_with_bench = ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []
        self.process = await asyncio.create_subprocess_exec(
            *dies_with_bench, sys.executable, "-m", "gpuhost_agent", "run", stdout=log, stderr=log, env=env
        )
        log.close()
        self.pids.append(self.process.pid)
        deadline = time.monotonic() + 60
        while not self.local.state.streams.connected:
            if self.process.returncode is not None or time.monotonic() > deadline:
                tail = (self.workdir / "agent.log").read_text()[-2000:]
                raise RuntimeError(f"the agent process did not connect; its log:\n{tail}")
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 60)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()


def rss_mib(pids: list[int]) -> float:
    """Resident memory of these processes together (MiB)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as status:
            total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return total / 1024

"""`gpuhost-agent run` as a real process against a marketplace served by the
test's own event loop, so that a test can kill -9 the agent, start it again
on the same state directory, and keep asking the marketplace what it heard.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from gpuhost_agent.local_marketplace import server
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.service.wiring import build_agent
from support.agent_config import make_config

FAST_INTERVALS = {"reconcileSeconds": 2, "containerResyncSeconds": 1, "heartbeatSeconds": 1}


class Market:
    """The local marketplace, stoppable and restartable on the same port."""

    def __init__(self, path: Path, intervals: dict | None = None):
        self.store = Store.load_or_create(path, "renter-test-key")
        self.state = MarketplaceState(self.store, {**FAST_INTERVALS, **(intervals or {})})
        self.running: server.RunningMarketplace | None = None
        self.port = 0

    async def start(self) -> None:
        self.running = await server.start(self.state, "127.0.0.1", self.port)
        self.port = int(self.running.base_url.rsplit(":", 1)[1].split("/")[0])

    async def stop(self) -> None:
        if self.running is not None:
            await self.running.stop()
            self.running = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


class AgentProcess:
    def __init__(self, tmp: Path, market: Market, **settings: str):
        self.tmp, self.market = tmp, market
        self.state_dir = tmp / "agent-state"
        key_file = tmp / "api-key"
        key_file.write_text(market.store.envApiKey)
        key_file.chmod(0o600)
        self.config = tmp / "agent.conf"
        lines = {
            "GPUHOST_MARKETPLACE_URL": market.base_url,
            "GPUHOST_ENV_ID": market.store.envId,
            "GPUHOST_API_KEY_FILE": str(key_file),
            "GPUHOST_STATE_DIR": str(self.state_dir),
            "GPUHOST_SETTLE_SECONDS": "0.5",
            "GPUHOST_STOP_TIMEOUT": "1",
            "GPUHOST_SPEEDTEST_MAX_BYTES": "200000",
            "GPUHOST_SPEEDTEST_MAX_SECONDS": "1",
            "GPUHOST_RECONCILE_GRACE_SECONDS": "4",
            "GPUHOST_LOG_LEVEL": "info",
            "GPUHOST_DISK_FLOOR": "0",  # a test machine's free disk is not the point (test_disk_floor.py)
            "GPUHOST_ALLOWED_REGISTRIES": "127.0.0.1:5000",  # the local test registry
            "GPUHOST_PULL_GUARD": "off",  # one port for many agents at once; test_pull_guard*.py turn it on
            **settings,
        }
        self.config.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
        self.process: asyncio.subprocess.Process | None = None
        self.runs = 0

    def configure(self, **settings: str) -> None:
        """More GPUHOST_ lines for the next start (a later line wins, as in the agent's own loader)."""
        self.config.write_text(self.config.read_text() + "".join(f"{k}={v}\n" for k, v in settings.items()))

    async def start(self, crash_at: str | None = None) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith("GPUHOST_")}
        env["GPUHOST_CONFIG"] = str(self.config)
        if crash_at:
            env["GPUHOST_CRASH_AT"] = crash_at
        self.runs += 1
        log = await asyncio.to_thread(open, self.tmp / f"agent-{self.runs}.log", "wb")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuhost_agent", "run", stdout=log, stderr=log, env=env
        )

    async def wait_exit(self, timeout: float = 60) -> int:
        return await asyncio.wait_for(self.process.wait(), timeout)

    async def stop(self) -> int | None:
        """SIGTERM, as systemd stops it; None if it was not running."""
        if self.process is None or self.process.returncode is not None:
            return None
        self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), 40)
        except asyncio.TimeoutError:
            self.process.kill()
            await self.process.wait()
            raise

    def logs(self) -> str:
        return "".join((self.tmp / f"agent-{run}.log").read_text(errors="replace") for run in range(1, self.runs + 1))


async def start_in_process(market: Market, state_dir: Path, **overrides):
    """An agent in the test's own event loop, talking to `market` over HTTP:
    (parts, task). Stop it with `gpuhost_agent.service.daemon.stop_agent(parts, task)`;
    a new one may then start on the same state directory."""
    config = make_config(
        state_dir,
        marketplace_url=market.base_url,
        env_id=market.store.envId,
        api_key=market.store.envApiKey,
        **overrides,
    )
    parts = build_agent(config, market.base_url, market.store.envApiKey)
    return parts, asyncio.create_task(parts.agent.run())


@asynccontextmanager
async def process_world(tmp_path: Path, docker_client, **settings: str) -> AsyncIterator[tuple]:
    """(renter, market, agent): a `Market`, an `AgentProcess` on it (not
    started; `settings` are its GPUHOST_ lines) and a renter's HTTP client;
    everything stopped and the environment's Docker objects removed after."""
    from support.engine import remove_env_resources
    from support.renter import Renter

    market = Market(tmp_path / "market.json")
    await market.start()
    agent = await asyncio.to_thread(AgentProcess, tmp_path, market, **settings)
    http = aiohttp.ClientSession()
    try:
        yield Renter(http, market.base_url, market.store), market, agent
    finally:
        await http.close()
        await agent.stop()
        await market.stop()
        await asyncio.to_thread(remove_env_resources, docker_client, market.store.envId)


class WorkerProcess:
    """`gpuhost-agent run` with GPUHOST_SWARM=worker (docs/swarm.md), started and
    stopped (or killed) as systemd would; its runs append to one log."""

    def __init__(self, log_path: Path, port: int, **env: str):
        self.log_path, self.port = log_path, port
        self.env = {key: value for key, value in os.environ.items() if not key.startswith("GPUHOST_")} | env
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        log = await asyncio.to_thread(open, self.log_path, "ab")
        try:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gpuhost_agent", "run", env=self.env, stdout=log, stderr=log
            )
        finally:
            log.close()
        for _ in range(100):  # until its door listens
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                assert self.process.returncode is None, await asyncio.to_thread(self.log_path.read_text)
                await asyncio.sleep(0.1)
        raise AssertionError("the worker's door did not listen in 10 s")

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(sig)
            await asyncio.wait_for(self.process.wait(), 20)

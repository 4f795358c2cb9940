"""The outbox (coalescing, order, retry) and configuration loading."""

from __future__ import annotations

import asyncio

import pytest

from gpuhost_agent.service import config
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.outbox import CONTAINERS, JOB_COMPLETE, STATUS, Outbox
from gpuhost_agent.uplink.replies import MarketplaceRejected, MarketplaceUnavailable


async def test_outbox_coalesces_keeps_order_and_retries():
    sent: list[tuple[str, str, dict]] = []
    failures = {"left": 2}
    gate = asyncio.Event()

    async def send(report):
        await gate.wait()
        if failures["left"]:
            failures["left"] -= 1
            raise MarketplaceUnavailable("down", retry_after=0.01)
        sent.append((report.kind, report.target, report.body))

    outbox = Outbox(send, AgentDB(None), base_delay=0.01)
    outbox.put(STATUS, "s1", {"status": "APPLYING"})
    outbox.put(CONTAINERS, "s1", {"n": 1})
    outbox.put(STATUS, "s1", {"status": "APPLIED"})  # replaces APPLYING, keeps its place
    outbox.put(CONTAINERS, "s1", {"n": 2})
    outbox.put(JOB_COMPLETE, "j1", {"outcome": "succeeded"})
    runner = asyncio.create_task(outbox.run())
    gate.set()
    assert await outbox.drained(5)
    runner.cancel()
    assert sent == [
        (STATUS, "s1", {"status": "APPLIED"}),
        (CONTAINERS, "s1", {"n": 2}),
        (JOB_COMPLETE, "j1", {"outcome": "succeeded"}),
    ]


async def test_outbox_drops_what_the_marketplace_rejects():
    async def send(report):
        raise MarketplaceRejected(404, "unknown stack")

    outbox = Outbox(send, AgentDB(None))
    outbox.put(STATUS, "gone", {"status": "APPLIED"})
    runner = asyncio.create_task(outbox.run())
    assert await outbox.drained(2)
    runner.cancel()
    assert outbox.rejected == 1 and outbox.pending() == 0


async def test_a_report_in_back_off_goes_at_once_when_the_marketplace_answers_again():
    """retry_now (a heartbeat went through): no waiting out a back-off of up to 30 s."""
    down = {"now": True}

    async def send(report):
        if down["now"]:
            raise MarketplaceUnavailable("down", retry_after=30)

    outbox = Outbox(send, AgentDB(None), base_delay=30, max_delay=30)
    outbox.put(STATUS, "s1", {"status": "APPLIED"})
    runner = asyncio.create_task(outbox.run())
    await asyncio.sleep(0.05)  # the first try failed: 30 s of back-off from here
    down["now"] = False
    assert not await outbox.drained(0.2)
    outbox.retry_now()
    assert await outbox.drained(2)
    runner.cancel()
    assert outbox.sent == 1


def test_config_priority_flags_over_env_over_file(tmp_path):
    conf = tmp_path / "agent.conf"
    key_file = tmp_path / "key"
    key_file.write_text("from-file-key\n")
    conf.write_text(
        "# comment\nGPUHOST_MARKETPLACE_URL=https://m.example/v1\nGPUHOST_ENV_ID=file-env\n"
        f"GPUHOST_API_KEY_FILE={key_file}\nGPUHOST_LOG_LEVEL=debug\n"
    )
    loaded = config.load({"config": str(conf), "env_id": "flag-env"}, environ={"GPUHOST_LOG_LEVEL": "warning"})
    assert loaded.marketplace_url == "https://m.example/v1" and not loaded.uses_local_marketplace
    assert loaded.env_id == "flag-env" and loaded.api_key == "from-file-key" and loaded.log_level == "warning"


def test_config_defaults_to_local_marketplace(tmp_path):
    loaded = config.load({"config": None, "state_dir": str(tmp_path)}, environ={"GPUHOST_CONFIG": ""})
    assert loaded.uses_local_marketplace and loaded.local_listen == ("127.0.0.1", 8787)
    assert (loaded.log_max_size, loaded.log_max_files) == ("50m", 3)
    assert loaded.disk_floor_bytes == 20 * 1024**3
    assert config.load({"disk_floor": "0"}, environ={}).disk_floor_bytes == 0
    assert config.load({"disk_floor": "512m"}, environ={}).disk_floor_bytes == 512 * 1024**2
    assert loaded.deploy_concurrency == 8
    assert config.load({}, environ={"GPUHOST_DEPLOY_CONCURRENCY": "12"}).deploy_concurrency == 12
    assert loaded.swarm == "" and config.load({}, environ={"GPUHOST_SWARM": "off"}).swarm == ""
    assert config.load({}, environ={"GPUHOST_SWARM": "Leader"}).swarm == "leader"


def test_the_environments_key_is_read_from_its_file(tmp_path):
    """install.sh --swarm-key-file keeps the key in a root-only file, not in agent.conf."""
    key_file = tmp_path / "swarm-key"
    key_file.write_text("0123456789abcdef0123\n")
    worker = config.load({}, environ={"GPUHOST_SWARM": "worker", "GPUHOST_SWARM_KEY_FILE": str(key_file)})
    assert worker.swarm == "worker" and worker.swarm_key == "0123456789abcdef0123"
    with pytest.raises(config.ConfigError, match="cannot read the environment's key file"):
        config.load({}, environ={"GPUHOST_SWARM": "worker", "GPUHOST_SWARM_KEY_FILE": str(tmp_path / "none")})


@pytest.mark.parametrize(
    "flags, fragment",
    [
        ({"marketplace_url": "https://m.example/v1"}, "GPUHOST_ENV_ID"),
        ({"marketplace_url": "ftp://m.example/v1", "env_id": "e", "api_key": "k"}, "must be http"),
        ({"local_listen": "8787"}, "HOST:PORT"),
        ({"config": "/no/such/file"}, "does not exist"),
        ({"api_key_file": "/no/such/key", "marketplace_url": "https://m/v1", "env_id": "e"}, "cannot read"),
        ({"log_max_size": "50 MB"}, "GPUHOST_LOG_MAX_SIZE '50 MB' must be a size such as 50m"),
        ({"log_max_files": "0"}, "GPUHOST_LOG_MAX_FILES must be at least 1"),
        ({"deploy_concurrency": "0"}, "GPUHOST_DEPLOY_CONCURRENCY must be at least 1"),
        ({"disk_floor": "20 GB"}, "GPUHOST_DISK_FLOOR '20 GB' must be a size such as 20g"),
        ({"swarm": "follower"}, "GPUHOST_SWARM must be leader or worker \\(or off, for one machine\\), not 'follower'"),
        ({"swarm": "worker"}, "GPUHOST_SWARM=worker needs GPUHOST_SWARM_KEY"),
        ({"swarm": "worker", "swarm_key": "short"}, "GPUHOST_SWARM_KEY must have at least 16 characters"),
        ({"swarm_workers": "n1"}, "GPUHOST_SWARM_WORKERS entry 'n1' must be <node id>=<host>:<port>"),
    ],
)
def test_config_errors_say_what_to_fix(flags, fragment):
    with pytest.raises(config.ConfigError, match=fragment):
        config.load(flags, environ={})

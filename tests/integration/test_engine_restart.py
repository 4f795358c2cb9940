"""dockerd restarted while a stack runs.

The agent notices the engine going away and coming back, without a restart of
its own; the reconcile that follows brings back the stack the restart stopped
(its container had no restart policy), and the marketplace's container list
matches Docker again.

Only a dockerd that scripts/ensure-dockerd.sh started (pidfile
/run/gpuhost-dockerd.pid) is ever restarted here: an engine someone else runs
is not ours to stop. It is started again in every case, since the tests after
this one need it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import aiohttp
import docker
import pytest
from support.agent_process import Market, start_in_process
from support.engine import remove_env_resources
from support.renter import Renter
from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.core.stacks.container_list import seed_containers
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.host_firewall import HostFirewall
from gpuhost_agent.service.daemon import stop_agent

PIDFILE = Path("/run/gpuhost-dockerd.pid")
ENSURE_DOCKERD = Path(__file__).resolve().parents[2] / "scripts" / "ensure-dockerd.sh"
# Stops at once on SIGTERM, so dockerd's shutdown does not wait for it.
TRAPPER = (
    f"services:\n  app:\n    image: {TEST_IMAGE}\n"
    f"    command: ['sh', '-c', 'trap \"exit 0\" TERM; while true; do sleep 1; done']\n"
    f"    stop_grace_period: 1s\n"
)


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _our_dockerd() -> int | None:
    try:
        pid = int(PIDFILE.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _ensure_dockerd() -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ENSURE_DOCKERD)], capture_output=True, text=True, timeout=90)


def _docker_answers() -> bool:
    try:
        client = docker.from_env(timeout=5)
        try:
            return client.ping()
        finally:
            client.close()
    except Exception:
        return False


def _docker_view(docker_client, stack_id: str) -> list[dict]:
    return seed_containers(
        docker_client.api.containers(all=True, filters={"label": [f"{wire.LABEL_STACK}={stack_id}"]})
    )


@pytest.fixture
async def world(tmp_path, docker_client):
    """(renter, market, parts, agent task, our dockerd's pid) with the engine watch pinging every 0.5 s;
    dockerd is made to answer again at the end whatever happened."""
    pid = await asyncio.to_thread(_our_dockerd)
    if pid is None:
        pytest.skip(
            f"the Docker Engine was not started by scripts/ensure-dockerd.sh ({PIDFILE} missing or its"
            " process gone): an engine we did not start is not ours to restart"
        )
    market = Market(tmp_path / "market.json")
    await market.start()
    parts, task = await start_in_process(market, tmp_path / "state", reconcile_grace_seconds=4)
    parts.agent.engine_watch.period = 0.5
    http = aiohttp.ClientSession()
    try:
        await asyncio.wait_for(parts.session.connected.wait(), 10)
        yield Renter(http, market.base_url, market.store), market, parts, task, pid
    finally:
        try:
            if not await asyncio.to_thread(_docker_answers):
                started = await asyncio.to_thread(_ensure_dockerd)
                assert started.returncode == 0, started.stdout + started.stderr
        finally:
            await http.close()
            await stop_agent(parts, task)
            await market.stop()
            await asyncio.to_thread(remove_env_resources, docker_client, market.store.envId)


async def _restart_dockerd(pid: int, while_down=None) -> None:
    """SIGTERM our dockerd, wait for it to exit, await `while_down` (if any), start it again."""
    os.kill(pid, signal.SIGTERM)
    await until(lambda: asyncio.to_thread(lambda: not _alive(pid)), timeout=30)
    if while_down is not None:
        await while_down()
    started = await asyncio.to_thread(_ensure_dockerd)
    assert started.returncode == 0, started.stdout + started.stderr
    assert await asyncio.to_thread(_our_dockerd) not in (None, pid)


async def _deployed_and_listed(renter: Renter, market: Market, docker_client) -> tuple[str, str, dict]:
    rental_id, stack_id, _job = await renter.deployed(TRAPPER)
    [before] = await asyncio.to_thread(_docker_view, docker_client, stack_id)
    assert before["State"] == "running"
    await until(lambda: market.store.containers.get(stack_id, {}).get("containers") == [before], timeout=10)
    return rental_id, stack_id, before


async def _running_again(docker_client, stack_id: str, timeout: float) -> dict:
    async def running() -> bool:
        view = await asyncio.to_thread(_docker_view, docker_client, stack_id)
        return [c["State"] for c in view] == ["running"]

    try:
        await until(running, timeout=timeout)
    except AssertionError:
        seen = [(c["Name"], c["State"]) for c in await asyncio.to_thread(_docker_view, docker_client, stack_id)]
        raise AssertionError(f"the stack's containers {timeout:.0f}s after the restart: {seen}") from None
    [after] = await asyncio.to_thread(_docker_view, docker_client, stack_id)
    return after


async def test_engine_restart_reconciled_without_agent_restart(world, docker_client):
    renter, market, parts, task, pid = world
    watch = parts.agent.engine_watch
    rental_id, stack_id, _before = await _deployed_and_listed(renter, market, docker_client)

    # Down long enough for the watch to see it (a restart between two pings is the next test's case).
    await _restart_dockerd(pid, while_down=lambda: until(lambda: watch.outages >= 1, timeout=10))
    await until(lambda: watch.up, timeout=15)
    after = await _running_again(docker_client, stack_id, timeout=30)
    assert not task.done(), task  # the agent did not stop (or restart) for the engine's restart
    assert watch.outages == 1
    # The egress rules the agent wrote at start are whole after the engine's restart, before its next check.
    firewall = HostFirewall()
    assert not await asyncio.to_thread(lambda: firewall.difference(firewall.wanted(()))), "egress rules lost"

    # The marketplace's list is Docker's: the same one container, running.
    await until(lambda: market.store.containers.get(stack_id, {}).get("containers") == [after], timeout=15)
    listed = market.store.containers[stack_id]["containers"]
    assert [(c["Id"], c["State"]) for c in listed] == [(after["Id"], "running")]
    assert len(await asyncio.to_thread(_docker_view, docker_client, stack_id)) == 1
    stack = next(s for s in await renter.stacks(rental_id) if s["stackId"] == stack_id)
    assert stack["status"] == wire.APPLIED, stack
    assert not task.done()
    assert parts.outbox.rejected == 0


class NotRestored(AssertionError):
    """The failure this test guards against, named apart from the other assertions."""


async def test_engine_restart_between_two_pings_is_reconciled(world, docker_client):
    """The same restart, as quick as the engine can make it, while the watch is
    between two pings (made certain here with a long period)."""
    renter, market, parts, task, pid = world
    watch = parts.agent.engine_watch
    rental_id, stack_id, _before = await _deployed_and_listed(renter, market, docker_client)

    watch.period = 3600
    await asyncio.sleep(1)  # the watch's current 0.5 s sleep ends and the long one begins
    await _restart_dockerd(pid)
    assert not task.done()
    try:
        after = await _running_again(docker_client, stack_id, timeout=8)
    except AssertionError as exc:
        raise NotRestored(str(exc)) from None
    assert not task.done()
    await until(lambda: market.store.containers.get(stack_id, {}).get("containers") == [after], timeout=10)

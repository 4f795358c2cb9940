"""An offered release, end to end short of systemd: the local marketplace
offers a wheel (GPUHOST_LOCAL_RELEASE_WHEEL's Release), the agent's Upgrades
fetches it over real HTTP with the environment's key, checks its sha256,
installs it with pip beside the running agent, asks it its version, puts it
on trial and asks for the restart. The restart, the trial and the rollbacks
under real systemd are in test_modern_host.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from support import agent_release

from gpuhost_agent.core import upgrade_offers, upgrade_plan
from gpuhost_agent.local_marketplace import server as local_server
from gpuhost_agent.local_marketplace.releases import Release
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import release_signature, wire, wire_release, wire_time
from gpuhost_agent.protocol.wire_release import FAILED, REFUSED, ROLLED_BACK
from gpuhost_agent.service.upgrades import Upgrades
from gpuhost_agent.storage import upgrade_state
from gpuhost_agent.uplink.client import MarketplaceClient

pytestmark = pytest.mark.asyncio


async def _offer(
    tmp_path: Path,
    agent_wheels: Path,
    version: str,
    state_dir: Path,
    *,
    supervised: bool = True,
    appended: dict[str, str] | None = None,
):
    wheel = await asyncio.to_thread(
        lambda: agent_release.variant(agent_release.agent_wheel(agent_wheels), tmp_path / "r", version, appended)
    )
    state = MarketplaceState(Store.load_or_create(None))
    state.release = await asyncio.to_thread(Release.of_wheel, wheel)
    market = await local_server.start(state, "127.0.0.1", 0)
    client = MarketplaceClient(market.base_url, state.store.envApiKey)
    restarted = asyncio.Event()
    policy = upgrade_offers.Policy(key=state.release_public_key())  # the key the install line pins
    upgrades = await asyncio.to_thread(  # it reads the upgrade record from disk
        lambda: Upgrades(
            state_dir,
            client,
            "0.1.0",
            42.0,
            restarted,
            supervised=supervised,
            policy=policy,
            installed=Path(sys.prefix),
        )
    )
    reply = await client.open_session({"agentVersion": "0.1.0", **upgrades.session_info()})
    return market, client, upgrades, restarted, reply, state


async def test_an_offered_release_is_fetched_checked_installed_and_put_on_trial(tmp_path, agent_wheels) -> None:
    state_dir = tmp_path / "state"
    market, client, upgrades, restarted, reply, state = await _offer(tmp_path, agent_wheels, "0.1.1", state_dir)
    try:
        assert reply["agentRelease"] == state.release.offer(state.release_key())
        assert state.store.host["agentUpgrade"] == {"running": "0.1.0", "lastAttempt": None}
        upgrades.offered(reply)
        assert upgrades._task is not None
        await asyncio.wait_for(upgrades._task, 180)
        assert restarted.is_set(), await asyncio.to_thread(upgrade_state.load, state_dir)
        trial = (await asyncio.to_thread(upgrade_state.load, state_dir))["trial"]
        assert (trial["version"], trial["starts"], trial["healthSeconds"]) == ("0.1.1", 0, 42.0)
        prefix = Path(trial["prefix"])
        said = await asyncio.to_thread(
            subprocess.run, [str(prefix / "bin" / "gpuhost-agent"), "version"], capture_output=True, text=True
        )
        assert said.stdout.strip() == "0.1.1"
        where = await asyncio.to_thread(
            subprocess.run,
            [str(prefix / "bin" / "python"), "-c", "import gpuhost_agent, aiohttp; print(gpuhost_agent.__file__)"],
            capture_output=True,
            text=True,
        )
        assert where.stdout.startswith(str(prefix)), where  # its own code; the dependencies are the installed agent's
        assert not await asyncio.to_thread(lambda: list(prefix.parent.glob(".download-*")))  # the download is not kept
    finally:
        await client.close()
        await market.stop()


async def test_a_wheel_that_is_not_the_offered_one_is_not_installed_and_the_marketplace_is_told(
    tmp_path, agent_wheels
) -> None:
    state_dir = tmp_path / "state"
    market, client, upgrades, restarted, reply, _state = await _offer(tmp_path, agent_wheels, "0.1.1", state_dir)
    try:
        offered = reply["agentRelease"]  # signed, but not the file served: a tampered file, or a lying mirror
        offered["sha256"] = "0" * 64
        signed = release_signature.Signed("0.1.1", "0" * 64, offered["size"], offered["notAfter"])
        offered["signature"] = release_signature.sign(_state.release_key(), signed)
        upgrades.offered(reply)
        assert upgrades._task is not None
        await asyncio.wait_for(upgrades._task, 60)
        assert not restarted.is_set()
        attempt = (await asyncio.to_thread(upgrade_state.load, state_dir))["lastAttempt"]
        assert attempt["outcome"] == FAILED and "sha256" in attempt["reason"]
        assert not await asyncio.to_thread(lambda: list((state_dir / upgrade_state.VERSIONS).glob("*")))
        reopened = await client.open_session({"agentVersion": "0.1.0", **upgrades.session_info()})
        assert reopened["sessionId"]
        assert _state.store.host["agentUpgrade"]["lastAttempt"]["outcome"] == FAILED
    finally:
        await client.close()
        await market.stop()


async def test_a_release_locked_to_other_dependencies_is_not_put_on_trial(tmp_path, agent_wheels) -> None:
    """Its lock (gpuhost_agent/agent.lock in the wheel) names a version the installed agent's
    environment does not have: the install fails before any trial, naming it."""
    state_dir = tmp_path / "state"
    other = {"gpuhost_agent/agent.lock": "structlog==0.0.1 \\\n    --hash=sha256:" + "0" * 64 + "\n"}
    market, client, upgrades, restarted, reply, _state = await _offer(
        tmp_path, agent_wheels, "0.1.1", state_dir, appended=other
    )
    try:
        upgrades.offered(reply)
        assert upgrades._task is not None
        await asyncio.wait_for(upgrades._task, 180)
        assert not restarted.is_set()
        attempt = (await asyncio.to_thread(upgrade_state.load, state_dir))["lastAttempt"]
        assert attempt["outcome"] == FAILED and "checking its lock" in attempt["reason"], attempt
        assert "structlog: locked 0.0.1, installed " in attempt["reason"], attempt
        assert not await asyncio.to_thread(lambda: list((state_dir / upgrade_state.VERSIONS).glob("*")))
    finally:
        await client.close()
        await market.stop()


def _marker_code(marker: Path) -> dict[str, str]:
    """Appended to the release's package: whatever of it runs (its `version` at install) leaves `marker`."""
    return {"gpuhost_agent/__init__.py": f"\nopen({str(marker)!r}, 'w').write('ran')\n"}


def _failed_before(state_dir: Path, version: str) -> None:
    """The record of a host where `version` (another build of it) was on trial and rolled back."""
    made = wire_release.ReleaseOffer(version, "/agent/releases/x.whl", "cd" * 32, 1)
    now = wire_time.iso()
    record = upgrade_plan.trial(upgrade_state.empty(), made, str(state_dir / "versions" / "old"), 1.0, now)
    record = upgrade_plan.start_choice(upgrade_plan.start_choice(record, now).record, now).record
    with upgrade_state.locked(state_dir):
        upgrade_state.save(state_dir, record)


@pytest.mark.parametrize(
    ("case", "version", "said"),
    [
        ("unsigned", "0.1.1", "not signed"),
        ("signed by another key", "0.1.1", "does not verify"),
        ("a downgrade", "0.0.9", "not newer than 0.1.0"),
        ("a rebuilt release that failed here", "0.1.1", "stopped before it passed its health check"),  # told
    ],
)
async def test_a_release_the_host_did_not_decide_on_runs_nothing_and_the_marketplace_is_told(
    tmp_path, agent_wheels, case, version, said
) -> None:
    """Over real HTTP from the local marketplace: nothing of the wheel runs (its marker stays absent),
    nothing is fetched or installed, and AgentInfo.upgrade says why."""
    state_dir, marker = tmp_path / "state", tmp_path / "marker"
    if case.startswith("a rebuilt"):
        await asyncio.to_thread(_failed_before, state_dir, version)
    market, client, upgrades, restarted, reply, state = await _offer(
        tmp_path, agent_wheels, version, state_dir, appended=_marker_code(marker)
    )
    try:
        if case == "unsigned":
            del reply["agentRelease"]["signature"]
        elif case == "signed by another key":
            offered = reply["agentRelease"]
            other = release_signature.new_private()
            version, sha256, size = offered["version"], offered["sha256"], offered["size"]
            signed = release_signature.Signed(version, sha256, size, offered["notAfter"])
            offered["signature"] = release_signature.sign(other, signed)
        upgrades.offered(reply)
        if upgrades._task is not None:  # a refusal is written; a skip (its rollback told) leaves the record
            await asyncio.wait_for(upgrades._task, 60)
        assert not restarted.is_set() and not await asyncio.to_thread(marker.exists)
        attempt = (await asyncio.to_thread(upgrade_state.load, state_dir))["lastAttempt"]
        expected = ROLLED_BACK if case.startswith("a rebuilt") else REFUSED
        assert attempt["outcome"] == expected and said in attempt["reason"], attempt
        assert not await asyncio.to_thread(lambda: list((state_dir / upgrade_state.VERSIONS).glob("*")))
        await client.open_session({"agentVersion": "0.1.0", **upgrades.session_info()})
        assert state.store.host["agentUpgrade"]["lastAttempt"]["reason"] == attempt["reason"]
    finally:
        await client.close()
        await market.stop()


async def test_an_agent_not_under_systemd_refuses_and_says_why(tmp_path, agent_wheels) -> None:
    state_dir = tmp_path / "state"
    market, client, upgrades, restarted, reply, _state = await _offer(
        tmp_path, agent_wheels, "0.1.1", state_dir, supervised=False
    )
    try:
        upgrades.offered(reply)
        assert upgrades._task is not None
        await asyncio.wait_for(upgrades._task, 30)
        attempt = (await asyncio.to_thread(upgrade_state.load, state_dir))["lastAttempt"]
        assert attempt["outcome"] == REFUSED and "systemd" in attempt["reason"]
        assert not restarted.is_set()
    finally:
        await client.close()
        await market.stop()


async def test_the_release_is_served_to_the_agents_key_only_and_by_its_name(tmp_path, agent_wheels) -> None:
    market, client, _upgrades, _restarted, reply, state = await _offer(tmp_path, agent_wheels, "0.1.1", tmp_path / "s")
    url = market.base_url + reply["agentRelease"]["path"]
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(url) as anonymous:
                assert anonymous.status == 401
            async with http.get(url, headers={wire.API_KEY_HEADER: state.store.renterApiKey}) as renter:
                assert renter.status == 401
            headers = {wire.API_KEY_HEADER: state.store.envApiKey}
            async with http.get(url, headers=headers) as agent:
                assert agent.status == 200
                assert len(await agent.read()) == reply["agentRelease"]["size"]
            async with http.get(url.replace("0.1.1", "0.1.2"), headers=headers) as other:
                assert other.status == 404
    finally:
        await client.close()
        await market.stop()

"""The marketplace moves to a new release key: a release the
key in force signed names the next one, the agent follows it, keeps the step
in its upgrade record across restarts, and from then on takes the new key's
word alone; the old key, if it leaked, installs nothing more."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import timedelta
from pathlib import Path

from gpuhost_agent.core import upgrade_offers
from gpuhost_agent.protocol import release_signature, wire_time
from gpuhost_agent.service.upgrades import Upgrades
from gpuhost_agent.storage import upgrade_state
from gpuhost_agent.uplink.replies import MarketplaceUnavailable

OLD, NEW = release_signature.new_private(), release_signature.new_private()
OLD_KEY, NEW_KEY = (release_signature.public_text(key.public_key()) for key in (OLD, NEW))


class _Client:
    """Fetches nothing: what is asked for is the sign that an offer was taken."""

    def __init__(self) -> None:
        self.fetched: list[str] = []

    async def download(self, path: str, size: int) -> bytes:
        self.fetched.append(path)
        raise MarketplaceUnavailable("not in this test")


def _offer(version: str, key, next_key: str | None = None) -> dict:
    sha = hashlib.sha256(version.encode()).hexdigest()
    not_after = release_signature.void_after(wire_time.utcnow() + timedelta(days=1))
    signed = release_signature.Signed(version, sha, 1000, not_after, next_key)
    made = {"version": version, "path": f"/agent/releases/gpuhost_agent-{version}-py3-none-any.whl", "sha256": sha}
    made |= {"size": 1000, "notAfter": not_after, "signature": release_signature.sign(key, signed)}
    return made | ({"nextKey": next_key} if next_key else {})


def _agent(state: Path, client: _Client) -> Upgrades:
    policy = upgrade_offers.Policy(key=OLD_KEY)  # what install.sh pinned
    return Upgrades(state, client, "0.1.0", 60, asyncio.Event(), supervised=True, policy=policy)  # type: ignore[arg-type]


async def _offered(upgrades: Upgrades, offer: dict) -> None:
    upgrades.offered({"agentRelease": offer})
    for task in (upgrades._task, upgrades._keys_task):  # noqa: SLF001
        if task is not None:
            await task


async def test_the_agent_follows_the_key_a_signed_release_names_and_the_old_key_installs_nothing_after(
    tmp_path: Path,
) -> None:
    client = _Client()
    upgrades = await asyncio.to_thread(_agent, tmp_path, client)
    await _offered(upgrades, _offer("0.1.0", OLD, next_key=NEW_KEY))  # the running version, naming the next key
    assert upgrades.policy.key == NEW_KEY
    record = await asyncio.to_thread(upgrade_state.load, tmp_path)
    assert record["keys"]["pinned"] == OLD_KEY and [s["nextKey"] for s in record["keys"]["steps"]] == [NEW_KEY]

    restarted = await asyncio.to_thread(_agent, tmp_path, client)  # the next start reads the step and checks it again
    assert restarted.policy.key == NEW_KEY
    await _offered(restarted, _offer("0.2.0", OLD))
    assert client.fetched == [] and "does not verify" in restarted.record["lastAttempt"]["reason"]
    await _offered(restarted, _offer("0.2.1", NEW))
    assert client.fetched == ["/agent/releases/gpuhost_agent-0.2.1-py3-none-any.whl"]


async def test_a_key_named_by_anyone_else_is_not_followed(tmp_path: Path) -> None:
    upgrades = await asyncio.to_thread(_agent, tmp_path, _Client())
    await _offered(upgrades, _offer("0.1.0", NEW, next_key=NEW_KEY))  # the new key vouching for itself
    unsigned = {**_offer("0.1.0", OLD), "nextKey": NEW_KEY}  # a key slipped into an offer the old key signed
    await _offered(upgrades, unsigned)
    assert upgrades.policy.key == OLD_KEY
    assert (await asyncio.to_thread(upgrade_state.load, tmp_path))["keys"] is None

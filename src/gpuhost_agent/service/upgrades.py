"""The agent's side of upgrades (core/upgrade_offers.py says which offers are
taken, core/upgrade_plan.py how they go): an offered release that the host's
policy takes (signed with its pinned key, newer, allowed) fetched from the
marketplace, checked against its sha256,
installed beside the running version, put on trial, and the agent restarted
into it by systemd; on trial, the confirmation once the new version is
healthy; and the account of the last attempt, which every session opening
carries to the marketplace (`AgentInfo.upgrade`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core import release_keys, upgrade_offers, upgrade_plan
from gpuhost_agent.protocol import wire_release, wire_time
from gpuhost_agent.protocol.wire_release import ReleaseOffer
from gpuhost_agent.protocol.wire_replies import OfferingReply
from gpuhost_agent.runtime import own_unit, release_install
from gpuhost_agent.service.launcher import LAUNCHED
from gpuhost_agent.storage import upgrade_state
from gpuhost_agent.uplink.client import MarketplaceClient
from gpuhost_agent.uplink.replies import MarketplaceRejected, MarketplaceUnavailable

log = get_logger(__name__)
HEALTH_POLL_SECONDS = 1.0
RETRY_SECONDS = 600.0  # an offer whose fetch or install failed is tried again after this


def supervised() -> bool:
    """Under systemd, which restarts the agent into the new version (NOTIFY_SOCKET: Type=notify)."""
    return bool(os.environ.get("NOTIFY_SOCKET"))


def installed_prefix() -> Path:
    """The installed agent's environment (install.sh's), which makes the next one."""
    return Path(os.environ.get(LAUNCHED) or sys.prefix)


class Upgrades:
    def __init__(
        self,
        state_dir: Path,
        client: MarketplaceClient,
        running: str,
        health_seconds: float,
        restart: asyncio.Event,
        *,
        supervised: bool,
        policy: upgrade_offers.Policy | None = None,
        prefix: Path | None = None,
        installed: Path | None = None,
    ):
        self.state_dir, self.client, self.running = state_dir, client, running
        self.policy = policy or upgrade_offers.Policy()
        self.health_seconds, self.restart, self.supervised = health_seconds, restart, supervised
        self.prefix = prefix or Path(sys.prefix)
        self.installed = installed or installed_prefix()
        self._task: asyncio.Task | None = None
        self._said: tuple[ReleaseOffer, str] | None = None  # the last offer and what was decided of it
        self._malformed: str | None = None
        self._failed: dict[str, float] = {}  # versions whose fetch or install failed, and when (monotonic)
        # Read once here (the composition root, before the loop runs); every
        # change this process makes goes through _update, which keeps it.
        self.record = upgrade_state.load(state_dir)
        self.pinned = self.policy.key  # install.sh's; the key in force moves on from it (core/release_keys.py)
        if self.pinned is not None:
            self.policy = replace(self.policy, key=release_keys.followed(self.pinned, self.record["keys"]))
        self._keys_task: asyncio.Task | None = None

    def session_info(self) -> dict:
        """AgentInfo.upgrade: the version that runs and how the last attempt ended."""
        return {"upgrade": {"running": self.running, "lastAttempt": self.record["lastAttempt"]}}

    def offered(self, reply: OfferingReply) -> None:
        """A session's or a heartbeat's reply: act on its agentRelease, in the background."""
        offer = wire_release.decode_offer(reply.get("agentRelease"))
        if offer is None:
            return
        if isinstance(offer, str):
            if self._malformed != offer:  # said once, not at every beat
                log.error("upgrade_refused", error=offer, hint="the marketplace's agentRelease is malformed")
            self._malformed = offer
            return
        now = wire_time.iso()
        action, why = upgrade_offers.offer_decision(offer, self.running, self.record, self.supervised, self.policy, now)
        self._follow_key(offer, now)
        if action == "none" or (self._task is not None and not self._task.done()):
            return
        failed = self._failed.get(offer.version)
        if action == "install" and failed is not None and time.monotonic() - failed < RETRY_SECONDS:
            return  # its fetch or install failed a moment ago: not again at every beat
        said, self._said = self._said, (offer, action)
        if action != "install" and said != self._said:  # said once, not at every beat
            log.warning("upgrade_not_installed", version=offer.version, outcome=action, reason=why)
        if action != "install":
            if action == "refuse" and (self.record["lastAttempt"] or {}).get("reason") != why:
                self._task = asyncio.create_task(self._attempt(offer.version, wire_release.REFUSED, why))
            return
        self._task = asyncio.create_task(self._install(offer), name="upgrade-install")

    def _follow_key(self, offer: ReleaseOffer, now: str) -> None:
        """The marketplace moves to a new release key in a release the key in force signed."""
        moved = upgrade_offers.next_key(offer, self.policy, now)
        if moved is None or self.pinned is None or (self._keys_task is not None and not self._keys_task.done()):
            return
        log.warning("release_key_moved", old=self.policy.key, new=moved, named_by_version=offer.version)
        self.policy = replace(self.policy, key=moved)
        pinned = self.pinned
        self._keys_task = asyncio.create_task(
            self._update(lambda record: {**record, "keys": release_keys.with_step(record["keys"], pinned, offer)}),
            name="release-key-moved",
        )

    async def _install(self, offer: ReleaseOffer) -> None:
        folder = self.state_dir / upgrade_state.VERSIONS / f"{offer.version}-{offer.sha256[:12]}"
        wheel = folder.with_name(f".download-{folder.name}") / offer.path.rsplit("/", 1)[-1]  # pip reads its name
        log.info("upgrade_installing", version=offer.version, running=self.running)
        try:
            body = await self.client.download(offer.path, offer.size)
            digest = hashlib.sha256(body).hexdigest()
            if digest != offer.sha256:
                raise release_install.InstallFailed(f"the wheel's sha256 is {digest}, not the offered {offer.sha256}")
            await asyncio.to_thread(_write, wheel, body)
            await release_install.install(wheel, offer.version, folder, self.installed)
        except (MarketplaceUnavailable, MarketplaceRejected, release_install.InstallFailed, OSError) as exc:
            log.error("upgrade_failed", version=offer.version, error=str(exc), retry_in_s=RETRY_SECONDS)
            now = time.monotonic()  # every offer that failed within the pause waits it out (offers may alternate)
            self._failed = {**{v: at for v, at in self._failed.items() if now - at < RETRY_SECONDS}, offer.version: now}
            await self._attempt(offer.version, wire_release.FAILED, str(exc)[:1000])
            return
        finally:
            await asyncio.to_thread(shutil.rmtree, wheel.parent, True)
        await self._update(
            lambda record: upgrade_plan.trial(record, offer, str(folder), self.health_seconds, wire_time.iso())
        )
        log.info("upgrade_restarting", version=offer.version, running=self.running, health_bound_s=self.health_seconds)
        await self._restart()

    async def _restart(self) -> None:
        """By a systemd job (runtime/own_unit.py); where that cannot be had,
        the agent stops and systemd's Restart=always starts it again."""
        unit = await asyncio.to_thread(own_unit.unit_name)
        problem = await own_unit.restart(unit) if unit else "the agent is not in a systemd service's cgroup"
        if problem:
            log.info("upgrade_restart_by_exit", reason=problem)
            self.restart.set()

    async def _attempt(self, version: str, outcome: str, reason: str) -> None:
        """An attempt that ended without a restart, told at the next session."""
        attempt = upgrade_plan.attempt_of(version, outcome, reason, wire_time.iso(), self.running)
        await self._update(lambda record: {**record, "lastAttempt": attempt})

    async def _update(
        self, change: Callable[[upgrade_state.UpgradeRecord], upgrade_state.UpgradeRecord | None]
    ) -> upgrade_state.UpgradeRecord | None:
        """The record read, changed and written under its lock (None: unchanged)."""

        def locked() -> upgrade_state.UpgradeRecord | None:
            with upgrade_state.locked(self.state_dir):
                changed = change(upgrade_state.load(self.state_dir))
                if changed is not None:
                    upgrade_state.save(self.state_dir, changed)
                    self.record = changed
                return changed

        return await asyncio.to_thread(locked)

    async def confirm_when_healthy(self, health: Callable[[], str | None]) -> None:
        """On trial: confirm this version once `health` says nothing is
        missing. The bound is the launcher's guardian's, not ours."""
        on_trial = self.record["trial"]
        if on_trial is None or on_trial["prefix"] != str(self.prefix):
            return
        said = None
        while (missing := health()) is not None:
            log.debug("upgrade_trial_waiting", version=self.running, missing=missing)
            if missing != said:  # for the guardian, should the bound come first
                said = missing
                await self._update(functools.partial(upgrade_plan.waiting, prefix=str(self.prefix), missing=missing))
            await asyncio.sleep(HEALTH_POLL_SECONDS)
        confirmed = await self._update(lambda record: upgrade_plan.confirmed(record, str(self.prefix), wire_time.iso()))
        if confirmed is None:
            return
        log.info("upgrade_confirmed", version=self.running, previous=on_trial["from"] or "the installed version")
        await asyncio.to_thread(self._prune, upgrade_plan.kept_prefixes(confirmed))

    def _prune(self, kept: set[str]) -> None:
        """Installed versions no longer needed (the one before a confirmed upgrade)."""
        folder = self.state_dir / upgrade_state.VERSIONS
        for entry in folder.iterdir() if folder.is_dir() else ():
            if entry.is_dir() and str(entry) not in kept:
                shutil.rmtree(entry, ignore_errors=True)

    async def stop(self) -> None:
        if self._keys_task is not None:  # a key followed is written whole, not cut off
            await asyncio.gather(self._keys_task, return_exceptions=True)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _write(path: Path, body: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_bytes(body)

"""Which offered releases a host takes: only the host decides what runs as root.

An offer is installed only when the host allows upgrades (GPUHOST_UPGRADES),
its signature verifies with the key the host pinned (install.sh
--release-key), its version is newer than the running one (or the one older
version the operator named), no build of that version failed here, and fewer
than MAX_RESTARTS_A_DAY upgrades restarted the agent in the last 24 hours.
How a taken offer goes on trial and back is core/upgrade_plan.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from gpuhost_agent.core import upgrade_plan
from gpuhost_agent.core.upgrade_plan import restarts_since
from gpuhost_agent.protocol import release_signature, wire_time
from gpuhost_agent.protocol.wire_release import ReleaseOffer
from gpuhost_agent.storage.upgrade_state import Failure, UpgradeRecord

MAX_RESTARTS_A_DAY = 3  # upgrade restarts in any 24 hours: a marketplace cannot keep the agent restarting
OFF, OFFERED = "off", "offered"  # GPUHOST_UPGRADES


@dataclass(frozen=True)
class Policy:
    """What the host decided of upgrades: GPUHOST_UPGRADES, the pinned release
    key's `ed25519:` line (None: `key_problem` says why there is none), and one
    older version an operator allows (GPUHOST_UPGRADE_ALLOW_VERSION)."""

    mode: str = OFFERED
    key: str | None = None
    key_problem: str = "no release key is pinned on this host"
    allow_version: str | None = None


def offer_decision(
    offer: ReleaseOffer, running: str, record: UpgradeRecord, supervised: bool, policy: Policy, now: str
) -> tuple[str, str]:
    """("none" | "skip" | "refuse" | "install", why) for an offer at a session's opening or a beat."""
    if offer.version == running:
        return "none", ""
    if policy.mode == OFF:
        return "refuse", "upgrades are off on this host (GPUHOST_UPGRADES=off): install.sh installs a new version"
    unsigned = signature_problem(offer, policy, now)
    if unsigned:
        return "refuse", unsigned
    backwards = _not_forward(offer.version, running, policy.allow_version)
    if backwards:
        return "refuse", backwards
    same: list[Failure] = [
        {**failed, "version": offer.version}
        for failed in record["failed"]
        if _same_version(failed.get("version"), offer.version)
    ]
    if upgrade_plan.failed_here(same, offer.version):
        why = f"version {offer.version} failed on this host before (whatever its build): offer a newer one"
        told = record.get("lastAttempt") or {}
        # The marketplace was told how it failed (rolled back, say): that account stands.
        return ("skip" if _same_version(told.get("version"), offer.version) else "refuse"), why
    if record["trial"] is not None:
        return "skip", f"version {record['trial']['version']} is on trial"
    if not supervised:
        return "refuse", "the agent does not run under systemd, which would start the new version: use install.sh"
    recent = restarts_since(record, now)
    if len(recent) >= MAX_RESTARTS_A_DAY:
        return "skip", f"{len(recent)} upgrade restarts in the last 24 hours, the most a day allows"
    return "install", ""


def signature_problem(offer: ReleaseOffer, policy: Policy, now: str) -> str | None:
    """Why the offer is not the pinned key's word, now; None when it is."""
    if policy.key is None:
        return f"{policy.key_problem}: install.sh --release-key pins the marketplace's"
    signed = offer.signed()
    if offer.signature is None or signed is None:
        return "the release is not signed (signature and notAfter)"
    try:
        verified = release_signature.verifies(policy.key, offer.signature, signed)
    except ValueError as exc:
        return f"the pinned release key is unusable: {exc}"
    if not verified:
        return "the release's signature does not verify with the release key pinned on this host"
    if wire_time.parse_iso(now) > wire_time.parse_iso(signed.not_after):
        return f"the offer was void after {signed.not_after} (its notAfter): a marketplace signs a fresh one"
    return None


def next_key(offer: ReleaseOffer, policy: Policy, now: str) -> str | None:
    """The key the marketplace signs with from now on, when an offer the pinned key
    signed (and not void) names one: the only way, besides the operator's, a
    host's release key changes."""
    if offer.next_key is None or offer.next_key == policy.key or signature_problem(offer, policy, now):
        return None
    return offer.next_key


def _not_forward(version: str, running: str, allowed: str | None, hint: bool = True) -> str | None:
    """Why `version` may not replace `running`, or None: versions only go
    forward, and only to releases (no pre-, dev- or local build) unless named.
    `hint`: say which setting names it (the agent's; install.sh has --version)."""
    try:
        offered, current = Version(version), Version(running)
    except InvalidVersion:
        return f"version {version} or {running} is not a version that can be ordered (PEP 440)"
    if version == allowed:
        return None
    allows = f" (GPUHOST_UPGRADE_ALLOW_VERSION={version} allows it)" if hint else ""
    if offered.is_prerelease or offered.is_devrelease or offered.local:
        return f"version {version} is not a release{allows}"
    if offered > current:
        return None
    return f"version {version} is not newer than {running}{allows}"


def backwards(offered: str, running: str, failed: list[Failure]) -> str | None:
    """Why the install line may not put `offered` in place of `running` unless
    its --version names it: the agent's own rules (not forward, or failed here
    before, however spelled), which install.sh asks of the installed agent."""
    why = _not_forward(offered, running, None, hint=False)
    if why:
        return why
    same: list[Failure] = [
        {**failure, "version": offered}
        for failure in failed
        if isinstance(failure, dict) and _same_version(failure.get("version"), offered)
    ]
    return "failed here before" if upgrade_plan.failed_here(same, offered) else None


def _same_version(failed: object, offered: str) -> bool:
    """One version however spelled (0.6 is 0.6.0)."""
    try:
        return isinstance(failed, str) and Version(failed) == Version(offered)
    except InvalidVersion:
        return failed == offered

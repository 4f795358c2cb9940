"""Upgrades a fleet can trust: the decisions, apart from their I/O.

The marketplace offers a release in its session reply; the agent installs it
beside the running version (storage/upgrade_state.py's record names both) and
exits, and systemd starts it again. The launcher, the first thing `run` does,
then starts the new version on trial, once. The version on trial confirms
itself when it is healthy (session opened, engine reachable, reconcile done).
If it is not within its bound, a guardian the launcher left stops it; if it
crashes, hangs (systemd's watchdog or start timeout kills it) or is stopped,
the next start finds the trial started and never confirmed, and the version
that ran before comes back. Every way out of a trial that is not a
confirmation is a rollback, decided by the version that was already trusted,
never by the new one. Renters' containers belong to dockerd, not to the
agent's unit: neither an upgrade nor a rollback touches them.

Which offers are taken at all is core/upgrade_offers.py's. This module loads
only the standard library, the wire's clock and the record's shape
(storage/upgrade_state.py, which the launcher reads it with): the launcher
decides with it before anything else of the agent is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from gpuhost_agent.protocol import wire_time
from gpuhost_agent.protocol.wire_release import ROLLED_BACK, UPGRADED, ReleaseOffer
from gpuhost_agent.storage.upgrade_state import Attempt, Failure, InstalledVersion, UpgradeRecord

FAILED_KEPT = 10  # versions that failed here, remembered so that one is not tried again and again
# What a version on trial lacks when the marketplace itself did not answer: an
# outage, not the version's fault. Such a trial is rolled back all the same,
# but the version is not marked failed: it may be tried again (3 restarts a day).
UNREACHABLE = "no session: the marketplace could not be reached"
OUTAGE_TRIALS = 2  # trials of one version that met an outage: after these it counts as failed
NO_ENGINE, NO_RECONCILE = "the Docker Engine not ready", "no reconcile done"
LACKS = (f", {NO_ENGINE}", f", {NO_RECONCILE}")  # what health_problem says after the session, if missing
NOT_HEALTHY = (
    "it stopped before it passed its health check (it crashed, exited, or was killed by systemd's "
    "watchdog or start timeout): journalctl -u gpuhost-agent shows why"
)


@dataclass(frozen=True)
class Start:
    """What the launcher does: run `prefix`'s agent (None: the installed one,
    itself), save `record`, and guard a trial for `guard_seconds`."""

    prefix: str | None
    record: UpgradeRecord
    guard_seconds: float | None = None
    said: str | None = None


def restarts_since(record: UpgradeRecord, now: str) -> list[str]:
    """The upgrade restarts of the last 24 hours before `now`."""
    since = wire_time.parse_iso(now) - timedelta(days=1)
    return [at for at in record.get("restarts") or [] if wire_time.is_moment(at) and wire_time.parse_iso(at) > since]


def trial(record: UpgradeRecord, offer: ReleaseOffer, prefix: str, health_seconds: float, now: str) -> UpgradeRecord:
    """The record once `offer` is installed at `prefix`: on trial at the next
    start, which counts as an upgrade restart at `now`."""
    return {
        **record,
        "restarts": [*restarts_since(record, now), now],
        "trial": {
            "version": offer.version,
            "sha256": offer.sha256,
            "prefix": prefix,
            "from": record["current"]["version"] if record["current"] else None,
            "starts": 0,
            "healthSeconds": health_seconds,
            "failure": None,
        },
    }


def start_choice(record: UpgradeRecord, now: str) -> Start:
    """The launcher's choice at a start of the unit."""
    on_trial = record["trial"]
    if on_trial is None:
        current = record["current"]
        return Start(current["prefix"] if current else None, record)
    if on_trial["starts"] >= 1:  # started before and never confirmed itself: roll back
        reason = on_trial.get("failure") or NOT_HEALTHY
        failure: Failure = {"version": on_trial["version"], "sha256": on_trial["sha256"], "reason": reason, "at": now}
        outage = on_trial.get("failure") is not None and only_unreachable(on_trial.get("waiting"))
        if outage:  # the bound came while the marketplace was away, and nothing else was missing
            failure["outage"] = True
            again = outage_trials(record["failed"], on_trial["version"]) + 1 < OUTAGE_TRIALS
            reason += (
                "; the marketplace was away, so the version may be offered again"
                if again
                else (f"; the marketplace was away at each of its {OUTAGE_TRIALS} trials: it is not tried again")
            )
        failed = [*record["failed"], failure]
        attempt = attempt_of(on_trial["version"], ROLLED_BACK, reason, now, on_trial["from"])
        back: UpgradeRecord = {**record, "trial": None, "failed": failed[-FAILED_KEPT:], "lastAttempt": attempt}
        current = record["current"]
        said = f"version {on_trial['version']} rolled back to {on_trial['from'] or 'the installed version'}: {reason}"
        return Start(current["prefix"] if current else None, back, said=said)
    started: UpgradeRecord = {**record, "trial": {**on_trial, "starts": on_trial["starts"] + 1}}
    said = f"version {on_trial['version']} on trial"
    return Start(on_trial["prefix"], started, float(on_trial["healthSeconds"]), said)


def confirmed(record: UpgradeRecord, prefix: str, now: str) -> UpgradeRecord | None:
    """The record once the version on trial at `prefix` passed its health
    check; None when `prefix` is not on trial (nothing to confirm)."""
    on_trial = record["trial"]
    if on_trial is None or on_trial["prefix"] != prefix:
        return None
    attempt = attempt_of(on_trial["version"], UPGRADED, "", now, on_trial["from"])
    current: InstalledVersion = {"version": on_trial["version"], "prefix": prefix}
    return {**record, "current": current, "trial": None, "lastAttempt": attempt}


def expired(record: UpgradeRecord, prefix: str, why: str) -> UpgradeRecord | None:
    """The record once the guardian found the trial at `prefix` still
    unconfirmed at its bound (`why`: what was missing); None when it is not."""
    on_trial = record["trial"]
    if on_trial is None or on_trial["prefix"] != prefix:
        return None
    lacked = on_trial.get("waiting")
    return {**record, "trial": {**on_trial, "failure": f"{why}: {lacked}" if lacked else why}}


def attempt_of(version: str, outcome: str, reason: str, now: str, previous: str | None) -> Attempt:
    return {"version": version, "outcome": outcome, "reason": reason, "at": now, "from": previous}


def health_problem(connected: bool, engine_ready: bool, reconciled: bool, unreachable: str | None = None) -> str | None:
    """What the version on trial still lacks, in the words the marketplace is told;
    `unreachable`: why the marketplace did not answer its last try, if it did not."""
    no_session = f"{UNREACHABLE} ({unreachable[:200]})" if unreachable else "no session with the marketplace"
    missing = [
        what for what, ok in ((no_session, connected), (NO_ENGINE, engine_ready), (NO_RECONCILE, reconciled)) if not ok
    ]
    return ", ".join(missing) or None


def outage_trials(failed: list[Failure], version: str) -> int:
    """The trials of `version` that ended while the marketplace was away."""
    return sum(1 for failure in failed if failure.get("version") == version and failure.get("outage"))


def failed_here(failed: list[Failure], version: str) -> bool:
    """Whether `version` counts as failed on this host: a trial of it failed, or
    OUTAGE_TRIALS of them met a marketplace away (core/upgrade_offers.py)."""
    mine = [failure for failure in failed if failure.get("version") == version]
    return any(not failure.get("outage") for failure in mine) or len(mine) >= OUTAGE_TRIALS


def only_unreachable(missing: object) -> bool:
    """Whether a health_problem said the marketplace was away, and nothing else."""
    return isinstance(missing, str) and missing.startswith(UNREACHABLE) and not missing.endswith(LACKS)


def waiting(record: UpgradeRecord, prefix: str, missing: str) -> UpgradeRecord | None:
    """The record with what the version on trial at `prefix` lacks now (the guardian
    says it if the bound comes first); None when it is not on trial or said so already."""
    on_trial = record["trial"]
    if on_trial is None or on_trial["prefix"] != prefix or on_trial.get("waiting") == missing:
        return None
    return {**record, "trial": {**on_trial, "waiting": missing}}


def kept_prefixes(record: UpgradeRecord) -> set[str]:
    """The installed versions' folders still needed: the one that runs and the one on trial."""
    return {part["prefix"] for part in (record["current"], record["trial"]) if part}

"""Upgrades' trials (core/upgrade_plan.py) and the offer's wire shape
(protocol/wire_release.py): what runs at a start, when a trial is rolled back
and what the marketplace is told. Which offers are taken: test_upgrade_offers.py."""

from __future__ import annotations

import pytest

from gpuhost_agent.core import upgrade_plan
from gpuhost_agent.protocol import wire_release
from gpuhost_agent.protocol.wire_release import ReleaseOffer
from gpuhost_agent.storage import upgrade_state

SHA = "ab" * 32
OFFER = ReleaseOffer("0.2.0", "/agent/releases/gpuhost_agent-0.2.0-py3-none-any.whl", SHA, 123456)
NOW = "2026-11-28T00:00:00.000Z"


def _on_trial(record: dict | None = None) -> dict:
    return upgrade_plan.trial(record or upgrade_state.empty(), OFFER, "/state/versions/0.2.0-abab", 30.0, NOW)


def test_without_a_trial_the_current_version_or_the_installed_one_runs() -> None:
    assert upgrade_plan.start_choice(upgrade_state.empty(), NOW).prefix is None
    record = {**upgrade_state.empty(), "current": {"version": "0.2.0", "prefix": "/v/0.2.0"}}
    choice = upgrade_plan.start_choice(record, NOW)
    assert (choice.prefix, choice.record, choice.guard_seconds) == ("/v/0.2.0", record, None)


def test_a_trial_gets_one_start_with_a_guardian_then_the_version_before_comes_back() -> None:
    before = {**upgrade_state.empty(), "current": {"version": "0.1.5", "prefix": "/v/0.1.5"}}
    first = upgrade_plan.start_choice(_on_trial(before), NOW)
    assert first.prefix == "/state/versions/0.2.0-abab" and first.guard_seconds == 30.0
    assert first.record["trial"]["starts"] == 1
    second = upgrade_plan.start_choice(first.record, NOW)  # it crashed, hung or was stopped: never confirmed
    assert second.prefix == "/v/0.1.5" and second.guard_seconds is None
    assert second.record["trial"] is None and second.record["current"] == before["current"]
    attempt = second.record["lastAttempt"]
    assert attempt["outcome"] == wire_release.ROLLED_BACK and attempt["version"] == "0.2.0"
    assert attempt["from"] == "0.1.5" and attempt["reason"] == upgrade_plan.NOT_HEALTHY
    assert second.record["failed"][-1]["sha256"] == SHA


def test_the_guardians_reason_is_the_one_the_rollback_tells() -> None:
    started = upgrade_plan.start_choice(_on_trial(), NOW).record
    expired = upgrade_plan.expired(started, "/state/versions/0.2.0-abab", "not healthy within 30 s")
    assert expired is not None
    assert upgrade_plan.start_choice(expired, NOW).record["lastAttempt"]["reason"] == "not healthy within 30 s"
    assert upgrade_plan.expired(started, "/elsewhere", "x") is None


def test_a_confirmed_trial_becomes_the_current_version_and_the_guardian_finds_nothing() -> None:
    started = upgrade_plan.start_choice(_on_trial(), NOW).record
    assert upgrade_plan.confirmed(started, "/elsewhere", NOW) is None
    confirmed = upgrade_plan.confirmed(started, "/state/versions/0.2.0-abab", NOW)
    assert confirmed is not None
    assert confirmed["current"] == {"version": "0.2.0", "prefix": "/state/versions/0.2.0-abab"}
    assert confirmed["trial"] is None and confirmed["lastAttempt"]["outcome"] == wire_release.UPGRADED
    assert upgrade_plan.expired(confirmed, "/state/versions/0.2.0-abab", "late") is None
    assert upgrade_plan.start_choice(confirmed, NOW).prefix == "/state/versions/0.2.0-abab"
    assert upgrade_plan.kept_prefixes(confirmed) == {"/state/versions/0.2.0-abab"}


def test_the_failed_list_is_bounded() -> None:
    record = upgrade_state.empty()
    for n in range(upgrade_plan.FAILED_KEPT + 5):
        offer = ReleaseOffer(f"0.2.{n}", OFFER.path, SHA, 1)
        started = upgrade_plan.start_choice(upgrade_plan.trial(record, offer, f"/v/{n}", 1.0, NOW), NOW).record
        record = upgrade_plan.start_choice(started, NOW).record
    assert len(record["failed"]) == upgrade_plan.FAILED_KEPT
    assert record["failed"][-1]["version"] == f"0.2.{upgrade_plan.FAILED_KEPT + 4}"


def test_health_names_what_is_missing() -> None:
    assert upgrade_plan.health_problem(True, True, True) is None
    assert upgrade_plan.health_problem(False, True, False) == "no session with the marketplace, no reconcile done"
    away = upgrade_plan.health_problem(False, True, True, unreachable="connection refused")
    assert away == f"{upgrade_plan.UNREACHABLE} (connection refused)"


def _bound_came(lacking: str | None, before: dict | None = None) -> dict:
    """The record after a trial's bound came while it lacked `lacking`, and the next start."""
    prefix = "/state/versions/0.2.0-abab"
    started = upgrade_plan.start_choice(_on_trial(before), NOW).record
    if lacking is not None:
        started = upgrade_plan.waiting(started, prefix, lacking) or started
    expired = upgrade_plan.expired(started, prefix, "not healthy within 30 s")
    assert expired is not None
    return upgrade_plan.start_choice(expired, NOW).record


def test_a_trial_that_met_a_marketplace_outage_is_rolled_back_but_not_marked_failed() -> None:
    """An outage of the marketplace during the health window
    marked a good version failed for ever. Rolled back all the same (nothing unproven
    runs), it may be offered again; a version that lacked anything else may not."""
    away = _bound_came(upgrade_plan.health_problem(False, True, True, unreachable="connection refused"))
    assert [failure.get("outage") for failure in away["failed"]] == [True] and away["trial"] is None
    assert not upgrade_plan.failed_here(away["failed"], "0.2.0")  # offered again, it may be tried
    assert away["lastAttempt"]["outcome"] == wire_release.ROLLED_BACK
    assert "could not be reached (connection refused)" in away["lastAttempt"]["reason"]
    assert away["lastAttempt"]["reason"].endswith("the marketplace was away, so the version may be offered again")
    # But not without end: a second trial away too, and the version counts as failed.
    again = _bound_came(upgrade_plan.health_problem(False, True, True, unreachable="refused"), away)
    assert upgrade_plan.failed_here(again["failed"], "0.2.0")
    assert again["lastAttempt"]["reason"].endswith("it is not tried again")
    for lacking in (
        upgrade_plan.health_problem(False, True, True),  # no session, and no word that the marketplace was away
        upgrade_plan.health_problem(False, False, True, unreachable="refused"),  # and the engine was not ready either
        None,
    ):
        assert [failed["version"] for failed in _bound_came(lacking)["failed"]] == ["0.2.0"], lacking
    crashed = upgrade_plan.start_choice(_on_trial(), NOW).record  # crashed while the marketplace was away
    crashed = upgrade_plan.waiting(crashed, "/state/versions/0.2.0-abab", f"{upgrade_plan.UNREACHABLE} (x)")
    assert crashed is not None and upgrade_plan.start_choice(crashed, NOW).record["failed"] != []


@pytest.mark.parametrize(
    ("offer", "problem"),
    [
        ("x", "must be an object"),
        ({**vars(OFFER), "version": "../../etc"}, "version must be"),
        ({**vars(OFFER), "path": "https://elsewhere.example/x.whl"}, "path must be /agent/releases/"),
        ({**vars(OFFER), "path": "/agent/releases/../sessions.whl"}, "path must be"),
        ({**vars(OFFER), "sha256": "AB" * 32}, "sha256 must be"),
        ({**vars(OFFER), "size": 10**9}, "size must be"),
        ({**vars(OFFER), "size": True}, "size must be"),
    ],
)
def test_a_malformed_offer_is_refused_naming_each_problem(offer: object, problem: str) -> None:
    decoded = wire_release.decode_offer(offer)
    assert isinstance(decoded, str) and problem in decoded


def test_a_well_formed_offer_and_none() -> None:
    assert wire_release.decode_offer(vars(OFFER)) == OFFER
    assert wire_release.decode_offer(None) is None


def test_the_record_survives_a_torn_or_foreign_file(tmp_path) -> None:
    (tmp_path / upgrade_state.FILE).write_text("{not json")
    assert upgrade_state.load(tmp_path) == upgrade_state.empty()
    record = _on_trial()
    with upgrade_state.locked(tmp_path):
        upgrade_state.save(tmp_path, record)
    assert upgrade_state.load(tmp_path) == record

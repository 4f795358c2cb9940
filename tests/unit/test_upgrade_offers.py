"""Which offered releases a host takes (core/upgrade_offers.py): only the host
decides what runs as root. Signed with the key it pinned, newer than what
runs (or the one older version the operator named), never a version that
failed here whatever its build, upgrades on, under systemd, a few a day."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpuhost_agent.core import release_keys, upgrade_offers, upgrade_plan
from gpuhost_agent.protocol import release_signature
from gpuhost_agent.protocol.wire_release import ReleaseOffer
from gpuhost_agent.storage import upgrade_state

NOW = "2026-12-06T12:00:00.000000Z"
KEY = release_signature.new_private()
PINNED = release_signature.public_text(KEY.public_key())
POLICY = upgrade_offers.Policy(key=PINNED)


VOID_AFTER = "2026-12-13T12:00:00Z"  # a week after NOW


def offer(
    version: str = "0.2.0", sha256: str = "ab" * 32, key=KEY, not_after: str = VOID_AFTER, next_key: str | None = None
) -> ReleaseOffer:
    path = f"/agent/releases/gpuhost_agent-{version}-py3-none-any.whl"
    signed = release_signature.Signed(version, sha256, 123456, not_after, next_key)
    signature = release_signature.sign(key, signed) if key is not None else None
    return ReleaseOffer(version, path, sha256, 123456, signature, not_after, next_key)


def decide(made: ReleaseOffer, record: dict | None = None, policy=POLICY, running: str = "0.1.0", **kw) -> tuple:
    record = record or upgrade_state.empty()
    return upgrade_offers.offer_decision(made, running, record, kw.get("supervised", True), policy, kw.get("now", NOW))


def test_a_newer_release_signed_with_the_pinned_key_is_installed() -> None:
    assert decide(offer()) == ("install", "")
    assert decide(offer(), running="0.2.0") == ("none", "")


@pytest.mark.parametrize(
    ("made", "policy", "said"),
    [
        (offer(key=None), POLICY, "not signed"),
        (offer(key=release_signature.new_private()), POLICY, "does not verify"),
        (replace(offer(), sha256="cd" * 32), POLICY, "does not verify"),  # a wheel other than the one signed
        (replace(offer(), version="0.3.0"), POLICY, "does not verify"),
        (replace(offer(), signature="not base64!"), POLICY, "does not verify"),
        (offer(), upgrade_offers.Policy(), "no release key is pinned"),
        (offer(), upgrade_offers.Policy(key="ed25519:short"), "unusable"),
        (offer(), upgrade_offers.Policy(mode=upgrade_offers.OFF, key=PINNED), "GPUHOST_UPGRADES=off"),
        (offer("0.0.9"), POLICY, "not newer than 0.1.0"),
        (offer("0.1.0rc1"), POLICY, "not a release"),
        (offer("0.1.0.post1", key=KEY), upgrade_offers.Policy(mode=upgrade_offers.OFF, key=PINNED), "off"),
    ],
)
def test_what_the_host_did_not_decide_is_refused_saying_why(made, policy, said) -> None:
    action, why = decide(made, policy=policy)
    assert action == "refuse" and said in why, why


def test_an_older_version_installs_only_when_the_operator_names_it() -> None:
    allowed = upgrade_offers.Policy(key=PINNED, allow_version="0.0.9")
    assert decide(offer("0.0.9"), policy=allowed) == ("install", "")
    assert decide(offer("0.0.8"), policy=allowed)[0] == "refuse"


def test_a_version_that_failed_here_is_refused_whatever_its_build() -> None:
    tried = upgrade_plan.trial(upgrade_state.empty(), offer(), "/v/0.2.0-abab", 30.0, NOW)
    rolled_back = upgrade_plan.start_choice(upgrade_plan.start_choice(tried, NOW).record, NOW).record
    action, why = decide(offer(), rolled_back)  # the marketplace was told it rolled back: that account stands
    assert action == "skip" and "failed on this host before" in why
    assert decide(offer(sha256="cd" * 32), rolled_back)[0] == "skip"  # rebuilt: the same version all the same
    assert decide(offer("0.2.1"), rolled_back) == ("install", "")
    later = {**rolled_back, "lastAttempt": {"version": "0.2.1", "outcome": "upgraded"}}
    action, why = decide(offer(sha256="cd" * 32), later, running="0.1.5")  # offered again after: refused, told
    assert action == "refuse" and "failed on this host before" in why


def test_no_second_install_while_one_is_on_trial_and_none_outside_systemd() -> None:
    on_trial = upgrade_plan.trial(upgrade_state.empty(), offer(), "/v/0.2.0-abab", 30.0, NOW)
    assert decide(offer("0.3.0"), on_trial)[0] == "skip"
    action, why = decide(offer(), supervised=False)
    assert action == "refuse" and "systemd" in why and "install.sh" in why


def test_at_most_a_few_upgrade_restarts_a_day() -> None:
    record = upgrade_state.empty()
    for n in range(upgrade_offers.MAX_RESTARTS_A_DAY):
        at = f"2026-12-06T0{n}:00:00.000000Z"
        record = upgrade_plan.confirmed(
            upgrade_plan.start_choice(upgrade_plan.trial(record, offer(f"0.2.{n}"), f"/v/{n}", 1.0, at), at).record,
            f"/v/{n}",
            at,
        )
    action, why = decide(offer("0.3.0"), record, running="0.2.2")
    assert action == "skip" and "restarts in the last 24 hours" in why
    assert decide(offer("0.3.0"), record, running="0.2.2", now="2026-12-07T00:30:00.000000Z") == ("install", "")


def test_a_pre_dev_or_local_build_is_taken_only_when_named() -> None:
    for version in ("0.2.0rc1", "0.2.0.dev3", "0.2.0+mine"):
        action, why = decide(offer(version))
        assert action == "refuse" and "not a release" in why, (version, why)
    assert decide(offer("0.2.0rc1"), policy=upgrade_offers.Policy(key=PINNED, allow_version="0.2.0rc1"))[0] == "install"


def test_a_failed_version_is_the_same_however_it_is_spelled() -> None:
    tried = upgrade_plan.trial(upgrade_state.empty(), offer("0.6.0"), "/v/0.6.0-abab", 30.0, NOW)
    rolled_back = upgrade_plan.start_choice(upgrade_plan.start_choice(tried, NOW).record, NOW).record
    assert decide(offer("0.6"), rolled_back)[0] == "skip"


def test_a_signature_has_one_spelling() -> None:
    made = offer()
    assert decide(made)[0] == "install"
    assert made.signature is not None and made.signature.endswith("==")
    other = made.signature[:-3] + chr(ord(made.signature[-3]) ^ 1) + "=="  # the same bytes, the padding bits set
    signed = made.signed()
    assert signed is not None
    assert release_signature.verifies(PINNED, made.signature, signed)
    assert not release_signature.verifies(PINNED, other, signed)


def test_an_offer_is_void_after_the_moment_it_was_signed_with() -> None:
    """A copy of an old offer (a release withdrawn since, a version with a known hole)
    cannot be offered again: the moment it is void after is signed with it."""
    void = decide(offer(not_after="2026-12-06T11:59:59Z"))
    assert void[0] == "refuse" and void[1].startswith("the offer was void after 2026-12-06T11:59:59Z")
    pushed_on = replace(offer(not_after="2026-12-06T11:59:59Z"), not_after="2099-01-01T00:00:00Z")
    assert "does not verify" in decide(pushed_on)[1]
    assert decide(replace(offer(), not_after=None))[1].startswith("the release is not signed")


NEXT = release_signature.new_private()
NEXT_KEY = release_signature.public_text(NEXT.public_key())


def test_the_key_moves_only_by_a_release_the_key_in_force_signed() -> None:
    assert upgrade_offers.next_key(offer(next_key=NEXT_KEY), POLICY, NOW) == NEXT_KEY
    assert upgrade_offers.next_key(offer(), POLICY, NOW) is None  # names none
    assert upgrade_offers.next_key(offer(key=NEXT, next_key=NEXT_KEY), POLICY, NOW) is None  # the new key's own word
    named_after = replace(offer(), next_key=NEXT_KEY)  # a key added to an offer the pinned key signed without it
    assert upgrade_offers.next_key(named_after, POLICY, NOW) is None
    void = offer(not_after="2026-12-06T11:59:59Z", next_key=NEXT_KEY)
    assert upgrade_offers.next_key(void, POLICY, NOW) is None


def test_the_key_in_force_follows_each_signed_step_from_the_pin_and_no_other() -> None:
    third = release_signature.new_private()
    third_key = release_signature.public_text(third.public_key())
    keys = release_keys.with_step(None, PINNED, offer(next_key=NEXT_KEY))
    keys = release_keys.with_step(keys, PINNED, offer("0.3.0", key=NEXT, next_key=third_key))
    assert release_keys.followed(PINNED, keys) == third_key
    assert release_keys.followed(NEXT_KEY, keys) == NEXT_KEY  # the operator pinned another key since: the pin wins
    forged = {**keys, "steps": [{**keys["steps"][0], "nextKey": third_key}, *keys["steps"][1:]]}
    assert release_keys.followed(PINNED, forged) == PINNED  # a step its key did not sign ends the walk
    assert release_keys.followed(PINNED, {"pinned": PINNED, "steps": "x"}) == PINNED


def test_the_release_key_file_must_be_roots_alone(tmp_path) -> None:
    from gpuhost_agent.service.wiring import key_file_problem

    key = tmp_path / "release-key.pub"
    key.write_text(PINNED)
    problem = key_file_problem(key)  # /tmp is everyone's to write in
    assert problem and "may be changed by another user than root" in problem
    assert key_file_problem(Path("/etc/passwd")) is None

"""The release key a host follows: the one install.sh pinned, then each key
that a release signed by the key before it named (upgrade_offers.next_key),
in order. The steps are kept with their signatures in the upgrade record
(`keys`) and checked again whenever they are read; steps taken under another
pinned key are not followed: the operator's pin wins.
"""

from __future__ import annotations

from gpuhost_agent.protocol import release_signature
from gpuhost_agent.protocol.wire_release import ReleaseOffer

MAX_STEPS = 32  # rotations kept: a marketplace rotates yearly, not at every beat


def followed(pinned: str, keys: object) -> str:
    """The key in force: `pinned`, moved on by each step that the key before it signed."""
    if not isinstance(keys, dict) or keys.get("pinned") != pinned or not isinstance(keys.get("steps"), list):
        return pinned
    key = pinned
    for step in keys["steps"][:MAX_STEPS]:
        signed = _signed(step)
        try:
            verified = signed is not None and release_signature.verifies(key, step["signature"], signed)
        except ValueError:
            verified = False
        if not verified or signed is None or signed.next_key is None:
            break
        key = signed.next_key
    return key


def with_step(keys: object, pinned: str, offer: ReleaseOffer) -> dict[str, object]:
    """`keys` with the move `offer` signed (upgrade_offers.next_key said it is one);
    unchanged once MAX_STEPS are kept (the operator pins the key then)."""
    steps = keys["steps"] if isinstance(keys, dict) and keys.get("pinned") == pinned else []
    if len(steps) >= MAX_STEPS:
        return {"pinned": pinned, "steps": steps}
    step = {"version": offer.version, "sha256": offer.sha256, "size": offer.size, "notAfter": offer.not_after}
    step |= {"nextKey": offer.next_key, "signature": offer.signature}
    return {"pinned": pinned, "steps": [*steps, step]}


def _signed(step: object) -> release_signature.Signed | None:
    if not isinstance(step, dict) or not isinstance(step.get("signature"), str):
        return None
    fields = (step.get("version"), step.get("sha256"), step.get("size"), step.get("notAfter"), step.get("nextKey"))
    if not (all(isinstance(f, str) for f in fields[:2] + fields[3:]) and type(fields[2]) is int):
        return None
    return release_signature.Signed(*fields)  # type: ignore[arg-type]

"""The agent release a marketplace offers in its session reply (`agentRelease`)
and the account the agent gives of its upgrades when it opens a session
(`AgentInfo.upgrade`), docs/agent-api.yaml.

The offer is a marketplace message, so it is untrusted like every other: it
may only name a wheel under the marketplace's own `/agent/releases/` path (the
agent fetches it with its own key from its own marketplace, never from an
address the message chose), a version that is a plain version string (it
becomes a folder name), a sha256 the download must match, and a size the
agent can bound its download by. It is signed (`signature`, release_signature.py):
an offer without one is decoded, and refused by the agent's upgrade decision.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuhost_agent.protocol import release_signature, wire_values

RELEASES_PATH = "/agent/releases/"
MAX_WHEEL_BYTES = 64 * 1024 * 1024  # the agent's wheel is about 1 MiB; its dependencies are not in it
VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!-]{0,63}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
WHEEL_NAME = re.compile(r"^[A-Za-z0-9_.+!-]{1,200}\.whl$")

# Outcomes of an upgrade attempt, as AgentInfo.upgrade.lastAttempt.outcome says them.
UPGRADED, ROLLED_BACK, REFUSED, FAILED = "upgraded", "rolled-back", "refused", "failed"
OUTCOMES = (UPGRADED, ROLLED_BACK, FAILED, REFUSED)


@dataclass(frozen=True)
class ReleaseOffer:
    version: str
    path: str  # under RELEASES_PATH, relative to the marketplace's base URL
    sha256: str
    size: int
    signature: str | None = None  # base64 of the Ed25519 signature (protocol/release_signature.py)
    not_after: str | None = None  # the offer is void after it (release_signature.NOT_AFTER); signed
    next_key: str | None = None  # the marketplace's next release key, named by a release the pinned key signed

    def signed(self) -> release_signature.Signed | None:
        """What its signature must cover; None when it names no moment it is void after."""
        if self.not_after is None:
            return None
        return release_signature.Signed(self.version, self.sha256, self.size, self.not_after, self.next_key)


MAX_SIGNATURE_CHARS = 200  # an Ed25519 signature is 88 characters of base64


def decode_offer(value: object) -> ReleaseOffer | str | None:
    """The offer, None when the reply has none, or what is wrong with it."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return "agentRelease must be an object"
    version, path, sha256, size = (value.get(key) for key in ("version", "path", "sha256", "size"))
    problems = []
    if not isinstance(version, str) or not VERSION.fullmatch(version):
        problems.append("version must be a version such as 0.2.0")
    name = path[len(RELEASES_PATH) :] if isinstance(path, str) and path.startswith(RELEASES_PATH) else ""
    if not WHEEL_NAME.fullmatch(name):
        problems.append(f"path must be {RELEASES_PATH}<wheel file name>")
    if not isinstance(sha256, str) or not SHA256.fullmatch(sha256):
        problems.append("sha256 must be 64 lowercase hex digits")
    if wire_values.whole(size, MAX_WHEEL_BYTES) in (None, 0):
        problems.append(f"size must be a byte count from 1 to {MAX_WHEEL_BYTES}")
    signature = value.get("signature")
    if signature is not None and (not isinstance(signature, str) or len(signature) > MAX_SIGNATURE_CHARS):
        problems.append("signature must be the base64 of an Ed25519 signature")
    not_after, next_key = value.get("notAfter"), value.get("nextKey")
    if not_after is not None and not (isinstance(not_after, str) and release_signature.NOT_AFTER.fullmatch(not_after)):
        problems.append("notAfter must be a UTC moment to the second, 2026-12-31T00:00:00Z")
    if next_key is not None and not (isinstance(next_key, str) and release_signature.KEY_LINE.fullmatch(next_key)):
        problems.append("nextKey must be a release key, ed25519:<base64 of 32 bytes>")
    if problems:
        return "agentRelease refused: " + "; ".join(problems)
    assert isinstance(version, str) and isinstance(path, str) and isinstance(sha256, str)
    return ReleaseOffer(version, path, sha256, int(size), signature, not_after, next_key)  # type: ignore[arg-type]

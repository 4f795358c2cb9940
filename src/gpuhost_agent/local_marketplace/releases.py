"""The agent release the local marketplace offers: a
wheel of the agent, its version read from the wheel's own metadata and its
sha256 computed here, offered in every session reply as `agentRelease` and
served at `GET /v1/agent/releases/{file}` to agents with the environment's
key (release_api.py, docs/agent-api.yaml). What the agent reports back about its upgrades
(`AgentInfo.upgrade`) is kept with the host and shown in the environment's
heartbeat.
"""

from __future__ import annotations

import email.parser
import hashlib
import re
import zipfile
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpuhost_agent.protocol import release_signature, wire_time
from gpuhost_agent.protocol.wire_release import MAX_WHEEL_BYTES, OUTCOMES, RELEASES_PATH, VERSION, WHEEL_NAME

UPGRADE_TEXT = 1000  # characters of a reason kept
OFFER_DAYS = 7  # an offer is void a week after it was made: a copy cannot be offered again later


@dataclass(frozen=True)
class Release:
    version: str
    wheel: Path
    sha256: str
    size: int

    @classmethod
    def of_wheel(cls, wheel: Path) -> Release:
        """ValueError naming what is wrong when `wheel` is not an agent wheel to offer."""
        if not WHEEL_NAME.match(wheel.name) or not wheel.is_file():
            raise ValueError(f"{wheel}: not a wheel file (…/gpuhost_agent-<version>-py3-none-any.whl)")
        body = wheel.read_bytes()
        if len(body) > MAX_WHEEL_BYTES:
            raise ValueError(f"{wheel}: {len(body)} bytes, more than an agent takes ({MAX_WHEEL_BYTES})")
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if re.fullmatch(r"gpuhost_agent-[^/]+\.dist-info/METADATA", n)]
            if len(names) != 1:
                raise ValueError(f"{wheel}: not a wheel of gpuhost-agent (no gpuhost_agent-*.dist-info/METADATA)")
            metadata = email.parser.HeaderParser().parsestr(archive.read(names[0]).decode("utf-8", "replace"))
        version = str(metadata.get("Version") or "")
        if not VERSION.match(version):
            raise ValueError(f"{wheel}: its metadata's version {version[:80]!r} is not a version")
        return cls(version, wheel, hashlib.sha256(body).hexdigest(), len(body))

    def offer(self, key: Ed25519PrivateKey, now: datetime | None = None) -> dict:
        """Session.agentRelease, signed with the marketplace's release key, void OFFER_DAYS after `now`."""
        not_after = release_signature.void_after((now or wire_time.utcnow()) + timedelta(days=OFFER_DAYS))
        signed = release_signature.Signed(self.version, self.sha256, self.size, not_after)
        return {
            "version": self.version,
            "path": RELEASES_PATH + self.wheel.name,
            "sha256": self.sha256,
            "size": self.size,
            "notAfter": not_after,
            "signature": release_signature.sign(key, signed),
        }


def upgrade_problem(value: object) -> str | None:
    """What is wrong with AgentInfo.upgrade, when an agent sent one (null is not one)."""
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("running"), str)
        or len(value["running"]) > 64
        or "lastAttempt" not in value
    ):
        return "upgrade must be an object with running (the agent's version) and lastAttempt"
    attempt = value.get("lastAttempt")
    if attempt is not None and (
        not isinstance(attempt, dict)
        or not all(isinstance(attempt.get(key), str) for key in ("version", "outcome", "reason", "at"))
        or len(attempt["reason"]) > UPGRADE_TEXT
        or not all(len(attempt[key]) <= 64 for key in ("version", "at"))
        or attempt["outcome"] not in OUTCOMES
        or not (attempt.get("from") is None or isinstance(attempt["from"], str) and len(attempt["from"]) <= 64)
    ):
        return (
            "upgrade.lastAttempt must be null or an object with version, outcome "
            f"({', '.join(OUTCOMES)}), reason, at (strings) and from (a version or null)"
        )
    return None

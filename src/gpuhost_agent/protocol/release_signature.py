"""An offered release is signed, and only the host decides whose signature counts.

The marketplace signs each release it offers with its release key (Ed25519):
the signature covers the version, the wheel's sha256 and its size, and so
the wheel's code and its locks (inside it); the moment after which the offer
is void, so a withdrawn release cannot be offered again from a copy; and,
when the marketplace moves to a new key, that key. install.sh pins the
public key on the host (GPUHOST_RELEASE_KEY_FILE, root's), and the agent
verifies an offer with it before it fetches a byte of the wheel: the
marketplace's word alone, or anyone's on the path, installs nothing.
A key is written `ed25519:<base64 of its 32 bytes>`, one line. cryptography
(8 MB resting) is loaded only when a key is used: most agents never see an offer.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PREFIX = "ed25519:"
SIGNATURE_BYTES = 64
KEY_LINE = re.compile(r"^ed25519:[A-Za-z0-9+/]{43}=$")
# One spelling of a moment (UTC, to the second), so that install.sh compares it with `date -u` as text.
NOT_AFTER = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$")


def void_after(moment: datetime) -> str:
    """`moment` (UTC) in NOT_AFTER's one spelling."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Signed:
    """What a release's signature covers."""

    version: str
    sha256: str
    size: int
    not_after: str  # NOT_AFTER: the offer is void after it
    next_key: str | None = None  # KEY_LINE: the key the marketplace signs with from now on

    def message(self) -> bytes:
        """In one spelling (install.sh's release_signed writes the same)."""
        lines = ["gpuhost-agent release", f"version {self.version}", f"sha256 {self.sha256}", f"size {self.size}"]
        lines.append(f"not-after {self.not_after}")
        if self.next_key is not None:
            lines.append(f"next-key {self.next_key}")
        return ("\n".join(lines) + "\n").encode()


def public_text(key: Ed25519PublicKey) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return PREFIX + base64.b64encode(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def parse_public(text: str) -> Ed25519PublicKey:
    """The key of an `ed25519:<base64>` line; ValueError saying what is wrong."""
    text = text.strip()
    if not text.startswith(PREFIX):
        raise ValueError(f"a release key is one line '{PREFIX}<base64>', not {text[:40]!r}")
    try:
        raw = base64.b64decode(text[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the release key's base64 is damaged") from None
    if len(raw) != 32:
        raise ValueError(f"a release key has 32 bytes, this one {len(raw)}")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return Ed25519PublicKey.from_public_bytes(raw)


def new_private() -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate()


def private_text(key: Ed25519PrivateKey) -> str:
    """The private key's 32 bytes in base64 (kept by the local marketplace in its store)."""
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    return base64.b64encode(key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())).decode()


def parse_private(text: str) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(base64.b64decode(text, validate=True))


def sign(key: Ed25519PrivateKey, signed: Signed) -> str:
    """The offer's `signature`: base64 of the Ed25519 signature of `signed.message()`."""
    return base64.b64encode(key.sign(signed.message())).decode()


def verifies(key: str, signature: str, signed: Signed) -> bool:
    """Whether `signature` is the release key's (`key`: its `ed25519:` line) over
    `signed`; ValueError when the key itself is unusable."""
    from cryptography.exceptions import InvalidSignature

    public = parse_public(key)
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(raw) != SIGNATURE_BYTES or base64.b64encode(raw).decode() != signature:  # one spelling only
        return False
    try:
        public.verify(raw, signed.message())
    except InvalidSignature:
        return False
    return True

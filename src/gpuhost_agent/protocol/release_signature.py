"""An offered release is signed, and only the host decides whose signature counts.

The marketplace signs each release it offers with its release key (Ed25519):
the signature covers the version, the wheel's sha256 and its size, and so
the wheel's code and its lock (gpuhost_agent/agent.lock inside it). install.sh
pins the public key on the host (GPUHOST_RELEASE_KEY_FILE, root's), and the
agent verifies an offer with it before it fetches a byte of the wheel: the
marketplace's word alone, or anyone's on the path, installs nothing.
A key is written `ed25519:<base64 of its 32 bytes>`, one line. cryptography
(8 MB resting) is loaded only when a key is used: most agents never see an offer.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PREFIX = "ed25519:"
SIGNATURE_BYTES = 64


def message(version: str, sha256: str, size: int) -> bytes:
    """What a release's signature covers, in one spelling."""
    return f"gpuhost-agent release\nversion {version}\nsha256 {sha256}\nsize {size}\n".encode()


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


def sign(key: Ed25519PrivateKey, version: str, sha256: str, size: int) -> str:
    """The offer's `signature`: base64 of the Ed25519 signature of `message`."""
    return base64.b64encode(key.sign(message(version, sha256, size))).decode()


def verifies(key: str, signature: str, version: str, sha256: str, size: int) -> bool:
    """Whether `signature` is the release key's (`key`: its `ed25519:` line) over the offer;
    ValueError when the key itself is unusable."""
    from cryptography.exceptions import InvalidSignature

    public = parse_public(key)
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(raw) != SIGNATURE_BYTES or base64.b64encode(raw).decode() != signature:  # one spelling only
        return False
    try:
        public.verify(raw, message(version, sha256, size))
    except InvalidSignature:
        return False
    return True

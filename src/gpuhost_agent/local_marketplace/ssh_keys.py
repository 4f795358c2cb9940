"""The user's SSH public keys: what `POST /v1/users/ssh-key` accepts, and the
seed's SSH key shape (name, publicKey, createdAt).

A key is checked by asyncssh, the library the agent's SSH server will use to
verify logins with these same keys: what it cannot load here could never log
in there, so it is refused at once with its reason instead of failing at the
renter's first `ssh`. Only the OpenSSH one-line public form is taken; the key
is stored re-exported by asyncssh (type, base64 blob, the name as comment),
so two spellings of one key are recognised as the same.
"""

from __future__ import annotations

from typing import Any

import asyncssh

from gpuhost_agent.errors import Refusal
from gpuhost_agent.protocol import wire_time

MAX_KEYS = 100
MAX_NAME = 100
MAX_KEY_TEXT = 16 * 1024  # an RSA-16384 public key is about 2.8 KiB


class KeyRefused(Refusal, ValueError):
    """The body cannot be taken; the message says what to change."""


class KeyConflict(Refusal, ValueError):
    """The key, or its name, is registered already."""


def _key_text(public_key: object) -> str:
    if not isinstance(public_key, str) or not public_key.strip():
        raise KeyRefused("publicKey must be an OpenSSH public key, e.g. 'ssh-ed25519 AAAA... me@laptop'")
    text = public_key.strip()
    if "PRIVATE KEY" in text:
        raise KeyRefused("publicKey is a private key: send the .pub file, and keep this one to yourself")
    if len(text) > MAX_KEY_TEXT or "\n" in text:
        raise KeyRefused("publicKey must be one line of at most 16 KiB (the contents of a .pub file)")
    return text


def new_key(body: Any, existing: list[dict]) -> dict:
    """The SSH key to store for a request body {publicKey, name?}; raises
    KeyRefused (400) or KeyConflict (409)."""
    if not isinstance(body, dict):
        raise KeyRefused("body must be a JSON object with publicKey (and optionally name)")
    text = _key_text(body.get("publicKey"))
    try:
        key = asyncssh.import_public_key(text)
    except (asyncssh.KeyImportError, ValueError) as exc:
        raise KeyRefused(f"publicKey is not a usable SSH public key: {exc}") from None
    if key.algorithm.startswith(b"ssh-dss"):  # the agent's SSH server takes no DSA signature (OpenSSH dropped it)
        raise KeyRefused("publicKey is a DSA key, which no longer logs in: make one with 'ssh-keygen -t ed25519'")
    name = body.get("name")
    if name is None:
        name = (text.split(maxsplit=2)[2:] or [""])[0].strip() or f"key-{len(existing) + 1}"
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise KeyRefused(f"name must be a non-empty string of at most {MAX_NAME} characters")
    name = name.strip()
    stored = key.export_public_key("openssh").decode().split()[:2]
    for other in existing:
        if other["publicKey"].split()[:2] == stored:
            raise KeyConflict(f"this key is registered already, as {other['name']!r}")
        if other["name"] == name:
            raise KeyConflict(f"a key named {name!r} exists; choose another name or delete it first")
    if len(existing) >= MAX_KEYS:
        raise KeyRefused(f"at most {MAX_KEYS} SSH keys; delete one first")
    return {"name": name, "publicKey": f"{stored[0]} {stored[1]} {name}", "createdAt": wire_time.iso()}


def host_key(text: object) -> dict | None:
    """The agent's SSH host key as tunnel info shows it ({hostKey,
    hostKeyFingerprint}), from the public line the agent's session sent; the
    fingerprint is computed here, not taken from the agent. None when the
    line is not a public key."""
    if not isinstance(text, str) or len(text) > MAX_KEY_TEXT or "\n" in text:
        return None
    try:
        key = asyncssh.import_public_key(text.strip())
    except (asyncssh.KeyImportError, ValueError):
        return None
    line = " ".join(key.export_public_key("openssh").decode().split()[:2])
    return {"hostKey": line, "hostKeyFingerprint": key.get_fingerprint("sha256")}


def login_keys(keys: list[dict]) -> list[str]:
    """The public lines the agent checks a login against."""
    return [key["publicKey"] for key in keys]


def user(store_user_id: str, keys: list[dict]) -> dict:
    """The seed's User, for the local marketplace's one user."""
    return {
        "orgId": "local-org",
        "userId": store_user_id,
        "userRole": "HOST",
        "sshKeys": [dict(key) for key in keys],
        "favoriteEnvIds": [],
        "paymentCheckoutSessionId": "",
        "orgName": "local",
    }

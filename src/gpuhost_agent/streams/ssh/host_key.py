"""The host's one SSH host key: made once, kept in the state directory.

Renters pin it (known_hosts), so it must survive agent restarts and upgrades:
a key that changed would make every renter's `ssh` refuse to connect with a
warning about an attack. Ed25519, the private key in a 0600 file beside the
agent's database. Its public line and fingerprint go to the marketplace with
each session (tunnel info shows them), so a renter can check the key before
trusting it.

asyncssh, which the agent's SSH server runs on, is a sixth of the agent's
resting memory (about 15 MB of imports, bench/idle_cost.py), and most hosts
serve SSH rarely or never. So the key's public line and fingerprint are read
here from the key file's public part with the standard library (OpenSSH's
key format keeps the public key blob in the clear); the key is made, the
first time, by a short-lived child process; and asyncssh is imported into
the agent only to load the key for the first SSH connection.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
import subprocess
import sys
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.errors import OutsideFailure

if TYPE_CHECKING:
    import asyncssh

log = get_logger(__name__)

FILE_NAME = "ssh_host_ed25519_key"
_MAGIC = b"openssh-key-v1\x00"
# Run by a child Python on the first start: asyncssh imported to make the key
# once would otherwise stay loaded in the agent for the rest of its life.
_MAKE_KEY = """
import os, sys
import asyncssh
key = asyncssh.generate_private_key("ssh-ed25519", comment="gpuhost-agent")
descriptor = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(descriptor, "wb") as handle:
    handle.write(key.export_private_key("openssh"))
    handle.flush()
    os.fsync(handle.fileno())
"""
_ARMOR = "OPENSSH PRIVATE KEY"


class HostKeyUnreadable(OutsideFailure, ValueError):
    """The key file is not an OpenSSH private key."""


class HostKey:
    """The key file, its public blob known at once, the key itself loaded
    (asyncssh) when the first SSH connection needs it."""

    def __init__(self, path: Path, blob: bytes):
        self.path, self.blob = path, blob

    @property
    def public_line(self) -> str:
        """Type and base64 blob, without the comment."""
        (kind_length,) = struct.unpack(">I", self.blob[:4])
        kind = self.blob[4 : 4 + kind_length].decode("ascii")
        return f"{kind} {base64.b64encode(self.blob).decode('ascii')}"

    @property
    def fingerprint(self) -> str:
        """As `ssh-keygen -l` and asyncssh print it: SHA256, base64 without padding."""
        digest = base64.b64encode(hashlib.sha256(self.blob).digest()).decode("ascii").rstrip("=")
        return f"SHA256:{digest}"

    @cached_property
    def key(self) -> asyncssh.SSHKey:
        import asyncssh  # only once SSH is used: see the module's docstring

        return asyncssh.read_private_key(str(self.path))


def public_blob(text: str) -> bytes:
    """The public key blob of an unencrypted OpenSSH private key file."""
    lines = [line.strip() for line in text.strip().splitlines()]
    if len(lines) < 3 or lines[0] != f"-----BEGIN {_ARMOR}-----" or lines[-1] != f"-----END {_ARMOR}-----":
        raise HostKeyUnreadable("not an OpenSSH private key file")
    try:
        raw = base64.b64decode("".join(lines[1:-1]), validate=True)
    except ValueError:
        raise HostKeyUnreadable("the key's base64 is damaged") from None
    if not raw.startswith(_MAGIC):
        raise HostKeyUnreadable("not an openssh-key-v1 key")
    offset = len(_MAGIC)
    for _field in ("cipher", "kdf", "kdf options"):
        offset = _skip_string(raw, offset)
    offset += 4  # the number of keys: the agent writes one
    start = offset
    offset = _skip_string(raw, offset)
    return raw[start + 4 : offset]


def _skip_string(raw: bytes, offset: int) -> int:
    if offset + 4 > len(raw):
        raise HostKeyUnreadable("the key file is cut short")
    (length,) = struct.unpack(">I", raw[offset : offset + 4])
    if offset + 4 + length > len(raw):
        raise HostKeyUnreadable("the key file is cut short")
    return offset + 4 + length


def load_or_create(state_dir: Path) -> HostKey:
    """The key in `state_dir`, made there on first use. A file that cannot be
    read is an error for the operator to see, never silently replaced: renters
    have pinned the key it held."""
    path = state_dir / FILE_NAME
    if path.exists():
        return HostKey(path, public_blob(path.read_text()))
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_suffix(".new")
    made = subprocess.run(
        [sys.executable, "-c", _MAKE_KEY, str(temporary)], capture_output=True, text=True, timeout=120, check=False
    )
    if made.returncode != 0:
        raise HostKeyUnreadable(f"could not make the SSH host key: {made.stderr.strip()[-500:]}")
    os.replace(temporary, path)
    host = HostKey(path, public_blob(path.read_text()))
    log.info("ssh_host_key_created", path=str(path), fingerprint=host.fingerprint)
    return host

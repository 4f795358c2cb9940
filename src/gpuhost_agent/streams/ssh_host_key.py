"""The host's one SSH host key: made once, kept in the state directory.

Renters pin it (known_hosts), so it must survive agent restarts and upgrades:
a key that changed would make every renter's `ssh` refuse to connect with a
warning about an attack. Ed25519, the private key in a 0600 file beside the
agent's database. Its public line and fingerprint go to the marketplace with
each session (tunnel info shows them), so a renter can check the key before
trusting it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.streams.ssh_access import key_blob

log = get_logger(__name__)

FILE_NAME = "ssh_host_ed25519_key"


@dataclass(frozen=True)
class HostKey:
    key: asyncssh.SSHKey

    @property
    def public_line(self) -> str:
        """Type and base64 blob, without the comment."""
        return key_blob(self.key.export_public_key("openssh").decode())

    @property
    def fingerprint(self) -> str:
        return self.key.get_fingerprint("sha256")


def load_or_create(state_dir: Path) -> HostKey:
    """The key in `state_dir`, made there on first use. A file that cannot be
    read is an error for the operator to see, never silently replaced: renters
    have pinned the key it held."""
    path = state_dir / FILE_NAME
    if path.exists():
        return HostKey(asyncssh.read_private_key(str(path)))
    key = asyncssh.generate_private_key("ssh-ed25519", comment="gpuhost-agent")
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_suffix(".new")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(key.export_private_key("openssh"))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    host = HostKey(key)
    log.info("ssh_host_key_created", path=str(path), fingerprint=host.fingerprint)
    return host

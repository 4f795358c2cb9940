"""The rental's SSH endpoint as the tunnel info shows it, once per running
container of an SSH-enabled stack (docs/streams.md, section 4): its login
name, the agent's host key and a command to paste that pins it.

Apart from tunnels.py (the listeners) because this is what a renter reads
and pastes, with its own reasons (why one alias, why KnownHostsCommand);
the listener's status, error and notice are laid over it by the book.
"""

from __future__ import annotations

import hashlib

from gpuhost_agent.protocol import ssh_login

SSH = "ssh"


def ssh_entry(stack_id: str, container_id: str, service: str, port: int, host_key: dict | None, env_id: str) -> dict:
    """The rental's SSH endpoint as one container's tunnel info shows it,
    with its login name and a command that pins the host key as pasted
    (ssh_command). `status` says `ready` once the host key is known (the
    listener exists only while a running container is open to SSH)."""
    user = ssh_login.ssh_login_name(service, stack_id)
    public = (host_key or {}).get("hostKey")
    alias = host_key_alias(env_id)
    return {
        "tunnelId": hashlib.sha256(f"{stack_id}/{container_id}/ssh".encode()).hexdigest()[:16],
        "service": service,
        "containerId": container_id,
        "containerPort": None,
        "protocol": SSH,
        "url": None,
        "host": "127.0.0.1",
        "port": port,
        "auth": None,
        "status": "ready" if host_key else "starting",
        "error": None,
        "notice": None,
        "ssh": {
            "host": "127.0.0.1",
            "port": port,
            "user": user,
            "hostKeyFingerprint": (host_key or {}).get("hostKeyFingerprint"),
            "hostKey": public,
            "hostKeyAlias": alias,
            "knownHostsLine": f"{alias} {public}" if public else None,
            "command": ssh_command(port, user, alias, public),
        },
    }


def host_key_alias(env_id: str) -> str:
    """The name the host key is pinned under, whatever the port: one pin for
    every SSH endpoint of the environment (the agent has one host key)."""
    return f"gpuhost-{env_id[:8]}"


def ssh_command(port: int, user: str, alias: str, public: str | None) -> str:
    """What a renter pastes: their key, and the host key pinned without a
    known_hosts file to edit: OpenSSH (8.5 and later) reads the
    KnownHostsCommand's output as known_hosts lines, under HostKeyAlias, and
    StrictHostKeyChecking=yes refuses any other key. `~/.ssh/id_ed25519` is
    ssh-keygen's default file: a renter with another key changes `-i`."""
    pin = ""
    if public:
        pin = f'-o HostKeyAlias={alias} -o StrictHostKeyChecking=yes -o "KnownHostsCommand=/bin/echo {alias} {public}" '
    return f"ssh -i ~/.ssh/id_ed25519 -p {port} {pin}{user}@127.0.0.1"

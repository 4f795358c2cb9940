"""OpenSSH's own clients (ssh, scp, sftp, ssh-keygen) pointed at a stack's SSH endpoint.

Every call pins the agent's host key from the tunnel info (StrictHostKeyChecking
yes, a known_hosts file of its own), reads no user configuration, offers only
the key given, and never asks for a password, so a test sees exactly what a
renter's client would, minus the prompts.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import select
import signal
import socket
import struct
import subprocess
import termios
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_key(path: Path) -> str:
    """A new ed25519 key pair at `path`; the public line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


async def registered_key(renter, path: Path) -> Path:
    """A new key pair at `path`, its public half added to the renter's account."""
    status, body = await renter.call("POST", "/users/ssh-key", {"publicKey": await asyncio.to_thread(make_key, path)})
    assert status == 200, body
    return path


def ssh_ready(tunnel: dict) -> bool:
    """A tunnel info entry of an SSH endpoint, once the agent's host key is known to the marketplace."""
    return tunnel["protocol"] == "ssh" and bool(tunnel["ssh"]["hostKey"])


async def ssh_stack(renter, key_public: str, content: str, services: int, name: str) -> tuple[str, dict]:
    """The renter's key registered, a new rental with an SSH-enabled stack of
    `content` APPLIED, and the SSH endpoint of each of its `services`
    services once the agent's host key is known: (stack id, service -> ssh info)."""
    status, body = await renter.call("POST", "/users/ssh-key", {"publicKey": key_public})
    assert status == 200 or "registered already" in body["message"], body
    rental_id, stack_id = await renter.applied(content, name=name, isSSHEnabled=True)
    tunnels = await renter.tunnels(rental_id, stack_id, services, ssh_ready, timeout=30)
    return stack_id, {t["service"]: t["ssh"] for t in tunnels}


def fingerprint(public_line: str, workdir: Path) -> str:
    """What `ssh-keygen -l` says the key's SHA256 fingerprint is."""
    path = workdir / "fingerprint.pub"
    path.write_text(public_line + "\n")
    out = subprocess.run(["ssh-keygen", "-l", "-f", str(path)], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


@dataclass
class Endpoint:
    """One stack's SSH endpoint as the tunnel info gives it."""

    host: str
    port: int
    host_key: str
    workdir: Path

    def __post_init__(self) -> None:
        self.known_hosts = self.workdir / "known_hosts"
        self.known_hosts.write_text(f"[{self.host}]:{self.port} {self.host_key}\n")

    def options(self, key: Path) -> list[str]:
        return [
            "-F",
            "/dev/null",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=10",
            "-i",
            str(key),
        ]

    def ssh(
        self,
        key: Path,
        user: str,
        *command: str,
        options: tuple[str, ...] = (),
        stdin: bytes = b"",
        timeout: float = 30,
    ) -> subprocess.CompletedProcess:
        """`ssh [options] user@host command...`: options go before the destination."""
        return subprocess.run(
            ["ssh", *self.options(key), *options, "-p", str(self.port), f"{user}@{self.host}", *command],
            input=stdin,
            capture_output=True,
            timeout=timeout,
        )

    def scp(self, key: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["scp", *self.options(key), "-P", str(self.port), *args], capture_output=True, timeout=timeout
        )

    def sftp(self, key: Path, user: str, batch: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["sftp", *self.options(key), "-P", str(self.port), "-b", "-", f"{user}@{self.host}"],
            input=batch.encode(),
            capture_output=True,
            timeout=timeout,
        )

    def remote(self, user: str, path: str) -> str:
        return f"{user}@{self.host}:{path}"


class PtySsh:
    """`ssh -tt` on a pseudo-terminal of ours, so it sends a real window size
    and resizes (SIGWINCH) as a terminal emulator would make it."""

    def __init__(self, endpoint: Endpoint, key: Path, user: str, rows: int, cols: int):
        self.master, slave = pty.openpty()
        self.resize(rows, cols)
        self.process = subprocess.Popen(
            ["ssh", "-tt", *endpoint.options(key), "-p", str(endpoint.port), f"{user}@{endpoint.host}"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
        os.close(slave)
        self.seen = b""

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        if hasattr(self, "process"):
            self.process.send_signal(signal.SIGWINCH)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def until(self, needle: bytes, timeout: float = 15) -> bytes:
        deadline = time.monotonic() + timeout
        while needle not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{needle!r} not seen; the terminal showed {self.seen[-500:]!r}"
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # the session ended and the terminal closed
                    break
        return self.seen

    def close(self) -> int:
        try:
            return self.process.wait(timeout=15)
        finally:
            os.close(self.master)

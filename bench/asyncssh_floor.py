"""asyncssh's floor on this machine, the reference row of scp in bench/tunnel.py.

`scp` out of a container crosses the marketplace's listener, the agent's
stream and SSH server (asyncssh), and the file helper in the container. How
fast does asyncssh serve SFTP at all on this machine, doing nothing else? A
bare asyncssh server in its own process, with the agent's ciphers
(streams/ssh/connection.py CIPHERS), serving a local copy of the same file
from its own folder (chroot) to the same OpenSSH scp on loopback: no relay,
no WebSocket, no helper. Whatever scp through the agent loses beyond this
row is ours; what this row loses against `docker cp` is asyncssh's (its
packet layer is Python, one packet of up to 32 KiB at a time).

    .venv/bin/python bench/asyncssh_floor.py --root DIR --authorized KEY.pub   # prints its port, serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path

import asyncssh

from gpuhost_agent.streams.ssh.connection import CIPHERS


class _Files(asyncssh.SFTPServer):
    """asyncssh's own SFTP server on the folder, with the exit status OpenSSH's
    scp needs (asyncssh closes the channel without one; the agent's
    ContainerSFTP.exit does the same)."""

    def exit(self) -> None:
        super().exit()
        self.channel.exit(0)


async def _serve(root: Path, authorized_keys: str) -> None:
    server = await asyncssh.listen(
        "127.0.0.1",
        0,
        server_host_keys=[asyncssh.generate_private_key("ssh-ed25519")],
        authorized_client_keys=asyncssh.import_authorized_keys(authorized_keys),
        sftp_factory=lambda chan: _Files(chan, chroot=bytes(root)),
        encryption_algs=CIPHERS,
    )
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.wait_closed()


class Floor:
    """The bare server in its own process, serving `root` to the key in `authorized`."""

    def __init__(self, root: Path, authorized: Path) -> None:
        self.root, self.authorized = root, authorized
        self.process: subprocess.Popen | None = None

    def start(self) -> int:
        """The server's port."""
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--root", str(self.root), "--authorized", str(self.authorized)],
            stdout=subprocess.PIPE,
            text=True,
            stderr=subprocess.DEVNULL,
        )
        assert self.process.stdout is not None
        return int(self.process.stdout.readline())

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--authorized", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(_serve(args.root, args.authorized.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

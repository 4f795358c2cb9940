"""The SFTP server never falls back on asyncssh's defaults:
asyncssh's SFTPServer acts on the agent's own file
system, as root, in every method a subclass does not define. ContainerSFTP
sent most operations to the container's file helper but inherited `link`
(os.link) and `lsetstat` (chmod/chown without following links), so a renter's
`ln` or `chmod -h` in OpenSSH's sftp changed host files. Here: every method
asyncssh has is defined by ContainerSFTP itself, and the refused ones touch
nothing. OpenSSH's sftp against the real agent:
tests/integration/test_sftp_host_paths_engine.py."""

from __future__ import annotations

import asyncio
import inspect
import stat
from pathlib import Path

import asyncssh
import pytest

from gpuhost_agent.streams.ssh.files import ContainerSFTP

METHODS = sorted(
    name for name, value in inspect.getmembers(asyncssh.SFTPServer) if callable(value) and not name.startswith("_")
)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_of_asyncssh_is_the_containers_own(name: str) -> None:
    """A method asyncssh adds in a later version fails here until it is
    defined (served through the helper, or refused)."""
    assert name in ContainerSFTP.__dict__, f"ContainerSFTP inherits {name} from asyncssh: it would act on the host"


def _server() -> ContainerSFTP:
    server = ContainerSFTP.__new__(ContainerSFTP)  # no channel: the refusals must not need one
    server._files = None  # type: ignore[assignment]  # and no helper: they must not reach it
    return server


def test_the_refused_operations_touch_no_host_file(tmp_path: Path) -> None:
    host_file = tmp_path / "host-only"
    host_file.write_text("host\n")
    host_file.chmod(0o600)
    server = _server()
    attrs = asyncssh.SFTPAttrs(permissions=0o4777)
    calls = [
        server.link(bytes(host_file), bytes(tmp_path / "linked")),
        server.lsetstat(bytes(host_file), attrs),
        server.fsync(3),
        server.fstatvfs(3),
        server.lock(3, 0, 1, 0),
        server.unlock(3, 0, 1),
        server.open56(bytes(host_file), 0, 0, attrs),
    ]
    for call in calls:
        with pytest.raises(asyncssh.SFTPOpUnsupported):
            asyncio.run(call)
    assert not (tmp_path / "linked").exists()
    assert stat.S_IMODE(host_file.stat().st_mode) == 0o600 and host_file.stat().st_nlink == 1


def test_names_are_the_containers_numbers_not_the_hosts_accounts() -> None:
    server = _server()
    assert (server.format_user(0), server.format_group(0), server.format_user(None)) == ("0", "0", "")
    assert server.map_path(b"/etc/shadow") == b"/etc/shadow"  # a path for the helper, never opened here

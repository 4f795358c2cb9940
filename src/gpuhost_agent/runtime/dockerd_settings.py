"""Settings of the dockerd process itself that `docker info` does not show:
whether it gives every container no-new-privileges by default.

On one machine the agent writes `no-new-privileges` into every container it
starts. A Swarm service cannot ask for it (`docker stack deploy` ignores
`security_opt`: core/swarm_rewrite.py), so on a Swarm node the engine must
hold it itself, and doctor must be able to tell. The engine is found by its
socket: the kernel names the process at the other end of a unix socket
(SO_PEERCRED), and that process's command line and daemon.json say the rest.
An engine over TCP, or one whose files cannot be read, is "unknown" (None),
never assumed safe.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path
from urllib.parse import urlparse

DEFAULT_DAEMON_JSON = "/etc/docker/daemon.json"
DEFAULT_SOCKET = "/var/run/docker.sock"


def engine_socket(docker_host: str | None) -> str | None:
    """The unix socket path of DOCKER_HOST (the default when unset); None for tcp:// and the like."""
    url = urlparse(docker_host or f"unix://{DEFAULT_SOCKET}")
    return url.path if url.scheme == "unix" and url.path else None


def engine_pid(socket_path: str) -> int | None:
    """The pid of the process listening on a unix socket, by the kernel's word."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        try:
            probe.connect(socket_path)
            pid, _uid, _gid = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        except OSError:
            return None
    return pid or None


def no_new_privileges(cmdline: list[str], daemon_json: dict | None) -> bool:
    """Whether dockerd started with this command line and configuration gives
    every container no-new-privileges. Pure. The flag wins over the file, as
    dockerd refuses a setting given in both."""
    for arg in cmdline[1:]:
        if arg == "--no-new-privileges" or arg == "--no-new-privileges=true":
            return True
        if arg == "--no-new-privileges=false":
            return False
    return bool((daemon_json or {}).get("no-new-privileges") is True)


def config_file(cmdline: list[str]) -> str:
    """The daemon.json a dockerd with this command line reads."""
    for i, arg in enumerate(cmdline):
        if arg.startswith("--config-file="):
            return arg.split("=", 1)[1]
        if arg == "--config-file" and i + 1 < len(cmdline):
            return cmdline[i + 1]
    return DEFAULT_DAEMON_JSON


def engine_no_new_privileges(docker_host: str | None = None) -> tuple[bool | None, str]:
    """(whether the engine at DOCKER_HOST defaults to no-new-privileges or None
    when that cannot be told, how it was told). Blocking: run it in a thread."""
    path = engine_socket(docker_host if docker_host is not None else os.environ.get("DOCKER_HOST"))
    if path is None:
        return None, "the engine is not on a local unix socket"
    pid = engine_pid(path)
    if pid is None:
        return None, f"no process answers on {path}"
    try:
        cmdline = [arg.decode() for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if arg]
    except OSError as exc:
        return None, f"cannot read the engine's command line (pid {pid}): {exc.strerror}"
    settings = config_file(cmdline)
    try:
        daemon_json = json.loads(Path(f"/proc/{pid}/root{settings}").read_text())
    except FileNotFoundError:
        daemon_json = None
    except (OSError, ValueError) as exc:
        return None, f"cannot read {settings}: {exc}"
    where = f"dockerd pid {pid}: " + ("--no-new-privileges" if "--no-new-privileges" in cmdline else settings)
    return no_new_privileges(cmdline, daemon_json), where

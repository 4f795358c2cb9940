"""Settings of the dockerd process itself that `docker info` does not show:
whether it gives every container no-new-privileges, and a cgroup namespace
of its own, by default.

On one machine the agent writes `no-new-privileges` and `cgroup: private`
into every container it starts. A Swarm service can ask for neither
(`docker stack deploy` ignores `security_opt` and has no cgroup namespace
field: core/swarm/stack_file.py), so on a Swarm node the engine must hold them
itself, and doctor must be able to tell. The engine is found by its
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
DEFAULT_PIDFILE = "/var/run/docker.pid"  # dockerd's own, unless --pidfile says otherwise


def engine_socket(docker_host: str | None) -> str | None:
    """The unix socket path of DOCKER_HOST (the default when unset); None for tcp:// and the like."""
    url = urlparse(docker_host or f"unix://{DEFAULT_SOCKET}")
    return url.path if url.scheme == "unix" and url.path else None


def dockerd_pid(socket_path: str) -> int | None:
    """dockerd's pid behind its socket: the process that made the socket, by the
    kernel's word, unless that is not dockerd (systemd's docker.socket made it
    and handed it over: then the pid 1), when dockerd's pid file says."""
    pid = engine_pid(socket_path)
    if pid is not None and _comm(pid) == "dockerd":
        return pid
    try:
        written = int(Path(DEFAULT_PIDFILE).read_text().strip())
    except (OSError, ValueError):
        return pid
    return written if _comm(written) == "dockerd" else pid


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


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


def cgroupns_private(cmdline: list[str], daemon_json: dict | None, cgroup_version: str | None) -> bool:
    """Whether dockerd started with this command line and configuration gives
    every container a cgroup namespace of its own. Pure. The flag wins over
    the file; with neither, dockerd's default: private on cgroup v2, the
    host's on v1."""
    for i, arg in enumerate(cmdline[1:], start=1):
        if arg.startswith("--default-cgroupns-mode="):
            return arg.split("=", 1)[1] == "private"
        if arg == "--default-cgroupns-mode" and i + 1 < len(cmdline):
            return cmdline[i + 1] == "private"
    mode = (daemon_json or {}).get("default-cgroupns-mode")
    return mode == "private" if mode is not None else str(cgroup_version or "") == "2"


def engine_defaults(docker_host: str | None = None, cgroup_version: str | None = None) -> dict:
    """What the engine at DOCKER_HOST gives every container by default:
    {"noNewPrivileges": {"default", "detail"}, "cgroupnsPrivate": {...}},
    `default` None when it cannot be told. Blocking: run it in a thread."""
    read = _engine_settings(docker_host if docker_host is not None else os.environ.get("DOCKER_HOST"))
    if isinstance(read, str):
        unknown = {"default": None, "detail": read}
        return {"noNewPrivileges": unknown, "cgroupnsPrivate": dict(unknown)}
    pid, cmdline, settings, daemon_json = read
    flagged = [arg for arg in cmdline if arg.startswith(("--no-new-privileges", "--default-cgroupns-mode"))]
    where = f"dockerd pid {pid}: " + (" ".join(flagged) or settings)
    return {
        "noNewPrivileges": {"default": no_new_privileges(cmdline, daemon_json), "detail": where},
        "cgroupnsPrivate": {"default": cgroupns_private(cmdline, daemon_json, cgroup_version), "detail": where},
    }


def engine_groups(docker_host: str | None = None) -> set[int] | str:
    """The group ids the engine at DOCKER_HOST runs with (its own and its
    supplementary ones, as /proc says), or why they cannot be read. Blocking."""
    path = engine_socket(docker_host if docker_host is not None else os.environ.get("DOCKER_HOST"))
    if path is None:
        return "the engine is not on a local unix socket"
    pid = dockerd_pid(path)
    if pid is None:
        return f"no process answers on {path}"
    try:
        status = Path(f"/proc/{pid}/status").read_text(errors="replace")
    except OSError as exc:
        return f"cannot read dockerd's /proc/{pid}/status: {exc.strerror or exc}"
    groups: set[int] = set()
    for line in status.splitlines():
        name, _, values = line.partition(":")
        if name == "Gid":
            groups.update(int(value) for value in values.split()[:1])
        elif name == "Groups":
            groups.update(int(value) for value in values.split() if value.isdigit())
    return groups


def engine_no_new_privileges(docker_host: str | None = None) -> tuple[bool | None, str]:
    """(whether the engine at DOCKER_HOST defaults to no-new-privileges or None
    when that cannot be told, how it was told). Blocking: run it in a thread."""
    held = engine_defaults(docker_host)["noNewPrivileges"]
    return held["default"], held["detail"]


def _engine_settings(docker_host: str | None) -> tuple[int, list[str], str, dict | None] | str:
    """(pid, command line, daemon.json path, its contents or None) of the
    dockerd behind DOCKER_HOST, or why they cannot be read."""
    path = engine_socket(docker_host)
    if path is None:
        return "the engine is not on a local unix socket"
    pid = dockerd_pid(path)
    if pid is None:
        return f"no process answers on {path}"
    try:
        cmdline = [arg.decode() for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if arg]
    except OSError as exc:
        return f"cannot read the engine's command line (pid {pid}): {exc.strerror}"
    settings = config_file(cmdline)
    try:
        daemon_json = json.loads(Path(f"/proc/{pid}/root{settings}").read_text())
    except FileNotFoundError:
        daemon_json = None
    except (OSError, ValueError) as exc:
        return f"cannot read {settings}: {exc}"
    return pid, cmdline, settings, daemon_json

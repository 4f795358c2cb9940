"""What a published file asks of the host that the stack can have on its
own instead: a host directory for data, the host's network, a host port, a
memory reservation sized for a bigger machine. Pure: part of
core/sandbox/make_safe.py, each change a notice the renter reads on the
APPLIED stack.

Nothing here ever gives a host path, the host's network or a chosen host
port: a host directory becomes an empty named volume of the stack (the host
path is never mounted, never created), the host's network becomes the
stack's own, a host port is dropped so that the engine picks a free one. What
the renter meant by the host's system paths (the Docker socket, /dev, /proc,
/etc, ...) an empty volume cannot give, so those binds stay for the policy to
refuse, with its reason (core/sandbox/policy.py).
"""

from __future__ import annotations

import posixpath
import re

from gpuhost_agent.core.sandbox.context import SandboxContext, shown_path, under

DROPPED_HOST_FILES = ("/etc/localtime", "/etc/timezone")
# Host system paths: what a bind of these means is the host's own devices,
# kernel, configuration, programs or sockets, which an empty volume does not
# give; they stay refused. /home and /root are not here: binds there are
# model caches and data (`/root/.cache/huggingface`), and become volumes.
SYSTEM_PATHS = (
    "/dev",
    "/proc",
    "/sys",
    "/etc",
    "/boot",
    "/run",
    "/var/run",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/var/log",
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/bin",
    "/sbin",
    "/snap",
    "/tmp/.X11-unix",
)
_SOCKET_NAME = re.compile(r"(\.sock|\.socket)$|^docker\.sock", re.IGNORECASE)
_VOLUME_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_.-]+")


def system_path(source: str) -> bool:
    """Whether a bind's (absolute) source is one of the host's system paths:
    `/` itself, a tree of SYSTEM_PATHS, or a socket (`*.sock`), judged on the
    path with `.`, `..` and repeated slashes resolved as the kernel would."""
    path = "/" + posixpath.normpath("/" + source).lstrip("/")
    if path == "/" or _SOCKET_NAME.search(posixpath.basename(path)):
        return True
    return any(under(path, root) for root in SYSTEM_PATHS)


def binds(model: dict, service: dict, ctx: SandboxContext, where: str, notices: list[str]) -> None:
    """Paths beside the file, in the home and any other data directory of the
    host (`/data/models`, `${MODEL_DIRECTORY}`) become named volumes of the
    stack with the same target; the host's clock files are dropped; binds of
    system paths are left for the policy to refuse."""
    kept = []
    for mount in service.get("volumes") or []:
        source = str(mount.get("source", "")) if isinstance(mount, dict) else ""
        if not isinstance(mount, dict) or mount.get("type") != "bind":
            kept.append(mount)
        elif source in DROPPED_HOST_FILES:
            notices.append(f"{where}: volumes {source} dropped: set the TZ variable for the time zone")
        elif not (beside := under(source, ctx.project_dir) or under(source, ctx.home_dir)) and (
            not source.startswith("/") or system_path(source)
        ):
            kept.append(mount)
        else:
            shown = shown_path(source, ctx)
            volume = _volume_name(shown, beside)
            model.setdefault("volumes", {})[volume] = {"name": f"{ctx.project}_{volume}"}
            new = {"type": "volume", "source": volume, "target": mount.get("target")}
            if mount.get("read_only"):
                new["read_only"] = True
            kept.append(new)
            why = "" if beside else ", empty at first: the host's directory is not given to a rental"
            notices.append(f"{where}: volumes {shown} became the stack's named volume {volume!r}{why}")
    if "volumes" in service:
        service["volumes"] = kept


def _volume_name(shown: str, beside: bool) -> str:
    """`./data` -> `bind_data`, `~/.cache/huggingface` -> `home_.cache_huggingface`,
    `/srv/models` -> `host_srv_models`, `../x` -> `host_x`."""
    if beside:
        body = shown[1:].strip("/")
        prefix = "home" if shown.startswith("~") else "bind"
    else:
        body = "/".join(part for part in shown.split("/") if part not in ("", ".", ".."))
        prefix = "host"
    stem = _VOLUME_NAME_CHARS.sub("_", body).strip("_") or "dir"
    return f"{prefix}_{stem}"[:200]


def host_network(model: dict, service: dict, ctx: SandboxContext, where: str, notices: list[str]) -> None:
    """`network_mode: host` (inference servers, for speed) runs on the
    stack's own network instead: reached like any other service, on the
    ports it declares."""
    if service.get("network_mode") != "host":
        return
    del service["network_mode"]
    service["networks"] = {"default": None}
    model.setdefault("networks", {}).setdefault("default", {"name": f"{ctx.project}_default"})
    declared = sorted(
        {str(port.get("target")) for port in service.get("ports") or [] if isinstance(port, dict)}
        | {str(port).split("/")[0] for port in service.get("expose") or []}
    )
    if declared:
        reached = f"its declared port(s) {', '.join(declared)} are reached through the stack's tunnels"
    else:
        reached = (
            "it declares no port, so nothing outside the container reaches it: add ports: or expose: "
            "with the ports its server listens on"
        )
    notices.append(
        f"{where}: network_mode host became the stack's own network (the host's network is not given to a "
        f"rental): {reached}; a server must listen on 0.0.0.0, not 127.0.0.1, to be reached"
    )


def host_ports(service: dict, where: str, notices: list[str]) -> None:
    """A published host port is dropped (core/sandbox/harden.py): the engine
    picks a free one, so two rentals pasting `8787:8080` do not collide. Said
    here, with where the renter finds the port the service got."""
    for port in service.get("ports") or []:
        if isinstance(port, dict) and port.get("published") not in (None, ""):
            notices.append(
                f"{where}: ports {port['published']}:{port.get('target')}: host port {port['published']} dropped; "
                f"container port {port.get('target')} is published on a free host port the engine picks "
                "(the stack's container list shows it as PublicPort) and reached through the stack's tunnel"
            )


def memory_reservation(service: dict, ctx: SandboxContext, where: str, notices: list[str]) -> None:
    """A memory reservation above the container's limit makes the engine
    refuse the container ("Minimum memory limit can not be less than memory
    reservation limit"): it is lowered to the limit (the rental's share, or
    the file's lower limit). Runs after the limits were lowered to the share."""
    limits = ((service.get("deploy") or {}).get("resources") or {}).get("limits") or {}
    reservations = ((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}
    limit = min(
        size for size in (_bytes(service.get("mem_limit")), _bytes(limits.get("memory")), ctx.memory_bytes) if size
    )
    for holder, key, shown in (
        (service, "mem_reservation", "mem_reservation"),
        (reservations, "memory", "deploy.resources.reservations.memory"),
    ):
        size = _bytes(holder.get(key))
        if size > limit:
            holder[key] = str(limit)
            notices.append(f"{where}: {shown} {_gib(size)} lowered to the container's memory limit ({_gib(limit)})")


def _bytes(value: object) -> int:
    try:
        return max(0, int(float(str(value))))
    except ValueError:
        return 0


def _gib(size: int) -> str:
    return f"{size / 1024**3:.1f} GiB"

"""What the worker's door (streams/door.py) lets through, and where a
tunnel's last hop may go. Pure: the door's I/O asks these before it relays
anything."""

from __future__ import annotations

import ipaddress
import json
import re
import signal
import ssl
import urllib.parse
from dataclasses import dataclass

from gpuhost_agent.errors import Refusal
from gpuhost_agent.protocol import wire
from gpuhost_agent.streams.tunnel import container_addresses, declared_ports, unverified_tls

Dial = tuple[int, str, int, ssl.SSLContext | None]  # a tunnel's last hop: process, address, port, TLS
_ID = r"([A-Za-z0-9][A-Za-z0-9_.-]{0,127})"
ROUTES = [  # (method, path pattern, what the id names)
    ("GET", re.compile(rf"/containers/{_ID}/json"), "container"),
    ("GET", re.compile(rf"/containers/{_ID}/logs"), "container"),
    ("POST", re.compile(rf"/containers/{_ID}/exec"), "container"),
    ("POST", re.compile(rf"/exec/{_ID}/start"), "exec"),
    ("POST", re.compile(rf"/exec/{_ID}/resize"), "exec"),
    ("GET", re.compile(rf"/exec/{_ID}/json"), "exec"),
    ("POST", re.compile(rf"/gpuhost/containers/{_ID}/connect"), "connect"),  # a tunnel's last hop
    ("POST", re.compile(rf"/gpuhost/containers/{_ID}/files"), "files"),  # SFTP's file helper
    ("POST", re.compile(rf"/gpuhost/exec/{_ID}/hangup"), "hangup"),  # a session ended
    ("POST", re.compile(rf"/gpuhost/exec/{_ID}/signal"), "signal"),  # an SSH client's signal
]
EXEC_IDS = ("exec", "hangup", "signal")  # routes whose id is an exec's
MACHINE_PATH = "/gpuhost/machine"  # this machine's own report (inventory/machine_report.py)
DISK_PATH = "/gpuhost/disk"  # the rentals' use of this machine's disk (core/disk_watch.py)
EVENTS_PATH = "/events"  # the engine's container events, cut to the agent's containers (core/swarm/worker_events.py)
SIGNALS = {int(s) for s in signal.Signals}  # an SSH client names a signal, the leader sends its number
VERSION_PREFIX = re.compile(r"^/v1\.\d+(?=/)")


def route(method: str, target: str) -> tuple[str, str] | None:
    """(what, id) of an allowed request, None for anything else. Pure."""
    path = VERSION_PREFIX.sub("", target.split("?", 1)[0])
    if (method, path) == ("GET", MACHINE_PATH):
        return "machine", ""
    if (method, path) == ("GET", DISK_PATH):
        return "disk", ""
    if (method, path) == ("GET", EVENTS_PATH):
        return "events", ""
    for allowed, pattern, what in ROUTES:
        if method == allowed and (found := pattern.fullmatch(path)):
            return what, found.group(1)
    return None


@dataclass(frozen=True)
class Approved:
    """A request that passed the checks: its route, id, target and container."""

    what: str
    ident: str
    target: str
    info: dict
    upgrade: bool = False  # bytes both ways after the answer's head
    head: bytes = b""  # for the engine's routes: the request as the engine gets it
    body: bytes = b""


class DoorRefused(Refusal):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def dial_target(approved: Approved) -> Dial:
    """Where a tunnel's last hop goes: one of the container's own addresses,
    on a TCP port it declares, from inside its network namespace; with TLS,
    unverified, when the stack is insecure (streams/tunnel.py)."""
    info = approved.info
    query = urllib.parse.parse_qs(approved.target.partition("?")[2])
    address, port = (query.get("address") or [""])[0], (query.get("port") or [""])[0]
    if not port.isdigit() or int(port) not in declared_ports(info):
        raise DoorRefused(403, f"port {port[:10]!r} is not a TCP port this container declares")
    if address not in container_addresses(info):
        raise DoorRefused(403, "not one of the container's own addresses")
    pid = int((info.get("State") or {}).get("Pid") or 0)
    if not (info.get("State") or {}).get("Running") or pid <= 0:
        raise DoorRefused(503, "the container is not running")
    return pid, address, int(port), unverified_tls() if query.get("tls") == ["1"] else None


def events_head() -> bytes:
    """The engine's event stream as the door asks it, whatever the leader's
    query said: container events of the agent's containers alone, the
    actions the agent follows alone (wire.CONTAINER_EVENTS)."""
    filters = json.dumps(
        {"type": ["container"], "label": [f"{wire.LABEL_MANAGED}=true"], "event": [*wire.CONTAINER_EVENTS]}
    )
    target = f"{EVENTS_PATH}?filters={urllib.parse.quote(filters)}"
    return f"GET {target} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n".encode()


def from_container(peer: str, networks: list[dict]) -> bool:
    """Whether a connection's address is in one of the engine's local networks
    (a container's, on a bridge, or on docker_gwbridge, through which a
    container on an overlay reaches its host): such a peer is never served,
    key or not. Anything not an address counts as one. Overlays (scope swarm)
    are left out: their packets reach a host's address only through
    docker_gwbridge, and their subnets (10.0.0.0/8 by default) may hold the
    leader's own LAN address."""
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return True
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for network in networks:
        if not isinstance(network, dict) or network.get("Scope") == "swarm":
            continue
        for config in (network.get("IPAM") or {}).get("Config") or []:
            try:
                if address in ipaddress.ip_network(str((config or {}).get("Subnet")), strict=False):
                    return True
            except (ValueError, AttributeError):
                continue
    return False

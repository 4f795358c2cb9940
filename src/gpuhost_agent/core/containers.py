"""Docker's container list entries turned into the seed's Container shape.

The seed's Container (Name, Id, Created, Labels as strings, Ports, State) is
Docker's own list format with a few fields flattened; keeping this a pure
function lets the shape be tested without an engine.
"""

from __future__ import annotations

from typing import Any

from .. import wire


def to_seed_container(raw: dict[str, Any]) -> dict[str, Any]:
    names = raw.get("Names") or []
    name = (names[0] if names else raw.get("Name", "")).lstrip("/")
    labels = raw.get("Labels") or {}
    return {
        "Name": name,
        "Id": raw.get("Id", ""),
        "Created": int(raw.get("Created") or 0),
        "Labels": sorted(f"{key}={value}" for key, value in labels.items()),
        "Ports": [_seed_port(port) for port in _sorted_ports(raw.get("Ports") or [])],
        "State": raw.get("State", ""),
    }


def _sorted_ports(ports: list[dict]) -> list[dict]:
    return sorted(ports, key=lambda p: (p.get("PrivatePort", 0), p.get("Type", ""), p.get("IP", ""), p.get("PublicPort", 0)))


def _seed_port(port: dict[str, Any]) -> dict[str, Any]:
    """PrivatePort and Type always; IP and PublicPort only where Docker published it."""
    shaped: dict[str, Any] = {"PrivatePort": int(port.get("PrivatePort", 0)), "Type": port.get("Type", "tcp")}
    if port.get("PublicPort"):
        shaped["IP"] = port.get("IP", "")
        shaped["PublicPort"] = int(port["PublicPort"])
    return shaped


def seed_containers(raw_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The seed shape for a stack's containers, in a stable order (by name)."""
    return sorted((to_seed_container(raw) for raw in raw_list), key=lambda c: c["Name"])


def failed_containers(raw_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Containers that are not running. (Docker's list entries carry State; the
    exit code only appears in Status, e.g. "Exited (3) 2 seconds ago".)"""
    return [raw for raw in raw_list if raw.get("State") not in ("running", "created", "restarting")]


def stack_id_of(raw: dict[str, Any]) -> str | None:
    return (raw.get("Labels") or {}).get(wire.LABEL_STACK)

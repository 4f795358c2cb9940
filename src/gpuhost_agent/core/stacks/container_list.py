"""Docker's container list entries turned into the seed's Container shape.

The seed's Container (Name, Id, Created, Labels as strings, Ports, State) is
Docker's own list format with a few fields flattened; keeping this a pure
function lets the shape be tested without an engine.

`State` is a free string in the seed, so a container that is not running says
why: `exited (137, OOM-killed)`, `restarting (1)`. Docker's list entry has the
exit code only inside its Status text and no OOM flag at all, so the facts of
an inspect (`ExitFacts`) are taken as input; without them the code comes from
Status and the OOM flag is simply not known.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.engine.records import ContainerState, ContainerSummary, PortSummary

SERVICE_LABEL = "com.docker.compose.service"
WITH_REASON = ("exited", "restarting")  # the states whose exit code says something
STOPPED = ("exited", "dead", "restarting")  # not running, and not by the agent's hand (created, paused)
_STATUS_CODE = re.compile(r"^(?:Exited|Restarting) \((-?\d+)\)")
_STATUS_UNHEALTHY = re.compile(r"\(unhealthy\)\s*$")  # Docker's Status: "Up 2 minutes (unhealthy)"
MAX_NAMED = 3  # containers named in one errorMsg

# An OOM kill at the rental's limit, which Docker's OOMKilled does not tell
# apart from one at the container's own (runtime/rental_cgroups.py).
RENTAL_MEMORY_REACHED = "the rental's memory limit, shared by all its containers, was reached"


@dataclass(frozen=True)
class ExitFacts:
    """What an inspect tells about a container's last exit."""

    exit_code: int | None
    oom_killed: bool = False
    rental_limit: bool = False  # killed for the rental's memory, which all its containers share


def exit_facts(state: ContainerState) -> ExitFacts:
    """From the `State` object of Docker's inspect."""
    code = state.get("ExitCode")
    return ExitFacts(code if isinstance(code, int) else None, bool(state.get("OOMKilled")))


def needs_facts(raw: ContainerSummary) -> bool:
    """Only a container that exited (or restarts after exiting) has facts worth an inspect."""
    return raw.get("State") in WITH_REASON


def status_exit_code(raw: ContainerSummary) -> int | None:
    """The code in Docker's Status text ("Exited (3) 2 seconds ago"), if any."""
    match = _STATUS_CODE.match(raw.get("Status") or "")
    return int(match.group(1)) if match else None


def unhealthy(raw: ContainerSummary) -> bool:
    """Running, but its image's or file's healthcheck fails: Docker says so only
    in the Status text of its list (and in the `health_status` event)."""
    return raw.get("State") == "running" and bool(_STATUS_UNHEALTHY.search(raw.get("Status") or ""))


def shaped_state(raw: ContainerSummary, facts: ExitFacts | None = None) -> str:
    """ "running" stays exactly that unless its healthcheck fails ("running
    (unhealthy)"); "exited"/"restarting" get the code and OOM."""
    state = raw.get("State", "")
    if unhealthy(raw):
        return "running (unhealthy)"
    if state not in WITH_REASON:
        return state
    code = facts.exit_code if facts is not None and facts.exit_code is not None else status_exit_code(raw)
    if code is None:
        return state
    return f"{state} ({code}{', OOM-killed' if facts is not None and facts.oom_killed else ''})"


def service_name(raw: ContainerSummary) -> str:
    """The Compose service the renter named, else the container's name."""
    labels = raw.get("Labels") or {}
    names = raw.get("Names") or []
    return labels.get(SERVICE_LABEL) or (names[0] if names else raw.get("Name", "?")).lstrip("/")


def stop_reason(raw: ContainerSummary, facts: ExitFacts | None = None) -> str | None:
    """Why the container is not running (or not healthy), in words for the
    renter; None when it runs, completed (exited 0), or waits in a state only
    the agent or the operator causes (created, paused)."""
    state = raw.get("State", "")
    if unhealthy(raw):
        return "is running but unhealthy (its healthcheck fails)"
    if state not in STOPPED:
        return None
    if state == "dead":
        return "is dead"
    code = facts.exit_code if facts is not None and facts.exit_code is not None else status_exit_code(raw)
    if state == "exited" and code == 0 and not (facts is not None and facts.oom_killed):
        return None  # completed: a one-shot service (migration, model download) did its work
    exited = "exited" if code is None else f"exited with code {code}"
    if facts is not None and facts.rental_limit:
        exited += f" (OOM-killed: {RENTAL_MEMORY_REACHED})"
    elif facts is not None and facts.oom_killed:
        exited += " (OOM-killed)"
    return exited if state == "exited" else f"is restarting: it {exited}"


def stack_error(raw_list: Sequence[ContainerSummary], facts: Mapping[str, ExitFacts] | None = None) -> str:
    """The errorMsg of an APPLIED stack: its stopped containers by service name
    (the first few), or "" when every container runs."""
    facts = facts or {}
    stopped = sorted(
        (service_name(raw), reason)
        for raw in raw_list
        if (reason := stop_reason(raw, facts.get(raw.get("Id", "")))) is not None
    )
    named = "; ".join(f"container {name} {reason}" for name, reason in stopped[:MAX_NAMED])
    more = len(stopped) - MAX_NAMED
    return f"{named}; and {more} more stopped" if more > 0 else named


def to_seed_container(raw: ContainerSummary, facts: ExitFacts | None = None) -> wire.Container:
    names = raw.get("Names") or []
    name = (names[0] if names else raw.get("Name", "")).lstrip("/")
    labels = raw.get("Labels") or {}
    return {
        "Name": name,
        "Id": raw.get("Id", ""),
        "Created": int(raw.get("Created") or 0),
        "Labels": sorted(f"{key}={value}" for key, value in labels.items()),
        "Ports": [_seed_port(port) for port in _sorted_ports(raw.get("Ports") or [])],
        "State": shaped_state(raw, facts),
    }


def _sorted_ports(ports: list[PortSummary]) -> list[PortSummary]:
    return sorted(
        ports, key=lambda p: (p.get("PrivatePort", 0), p.get("Type", ""), p.get("IP", ""), p.get("PublicPort", 0))
    )


def _seed_port(port: PortSummary) -> wire.ContainerPort:
    """PrivatePort and Type always; IP and PublicPort only where Docker published it."""
    shaped: wire.ContainerPort = {"PrivatePort": int(port.get("PrivatePort", 0)), "Type": port.get("Type", "tcp")}
    if port.get("PublicPort"):
        shaped["IP"] = port.get("IP", "")
        shaped["PublicPort"] = int(port["PublicPort"])
    return shaped


def seed_containers(
    raw_list: list[ContainerSummary], facts: Mapping[str, ExitFacts] | None = None
) -> list[wire.Container]:
    """The seed shape for a stack's containers, in a stable order (by name);
    `facts` by container id, for those an inspect was made for."""
    facts = facts or {}
    return sorted((to_seed_container(raw, facts.get(raw.get("Id", ""))) for raw in raw_list), key=lambda c: c["Name"])


def failed_containers(raw_list: list[ContainerSummary]) -> list[ContainerSummary]:
    """Containers that are not running, except those that completed (exited
    0): Compose itself counts a one-shot service that exits 0 as done
    (`service_completed_successfully`). (Docker's list entries carry State;
    the exit code only appears in Status, e.g. "Exited (3) 2 seconds ago".)"""
    return [
        raw
        for raw in raw_list
        if raw.get("State") not in ("running", "created", "restarting")
        and not (raw.get("State") == "exited" and status_exit_code(raw) == 0)
    ]


def stack_id_of(raw: ContainerSummary) -> str | None:
    return (raw.get("Labels") or {}).get(wire.LABEL_STACK)

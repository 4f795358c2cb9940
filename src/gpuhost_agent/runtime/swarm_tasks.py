"""A Swarm stack's containers on every machine, from the manager's answers
(`GET /services`, `/tasks`). Pure. (The environment's GPUs, from `GET
/nodes`: inventory/swarm_nodes.py and core/gpus/allocation.py.)

A task is one container of a service on one machine. The
manager knows every task, including those on other machines, so the
container list is built from tasks (the newest of each service's slot) in
the shape of Docker's container list, and then goes through the same
seed shaping as on one machine (core/stacks/container_list.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, cast

from gpuhost_agent.runtime.compose import COMPOSE_SERVICE_LABEL as SERVICE_LABEL
from gpuhost_agent.runtime.declared_ports import labelled_ports
from gpuhost_agent.runtime.engine.records import ContainerSummary, PortSummary
from gpuhost_agent.runtime.swarm_stacks import NAMESPACE_LABEL

NODE_LABEL = "com.docker.swarm.node.id"
# Task states (swarmkit's TaskState) as Docker's container states.
ENDED = {"complete": "exited", "failed": "exited", "shutdown": "exited", "rejected": "dead", "orphaned": "dead"}


def stack_containers(
    services: Sequence[Mapping[str, Any]], tasks: Sequence[Mapping[str, Any]]
) -> list[ContainerSummary]:
    """The stack's containers on every machine, as Docker's container list
    gives them on one: the newest task of each service's slot."""
    names = {str(s.get("ID")): str((s.get("Spec") or {}).get("Name") or "") for s in services}
    newest: dict[tuple[str, object], Mapping[str, Any]] = {}
    for task in tasks:
        key = (str(task.get("ServiceID")), task.get("Slot") or task.get("NodeID"))
        if key not in newest or _version(task) >= _version(newest[key]):
            newest[key] = task
    return [
        _container(task, names.get(str(task.get("ServiceID")), "?"))
        for task in newest.values()
        if (task.get("Status") or {}).get("State") not in ("orphaned", "remove")
    ]


def _container(task: Mapping[str, Any], service: str) -> ContainerSummary:
    status = task.get("Status") or {}
    spec = (task.get("Spec") or {}).get("ContainerSpec") or {}
    prefix = f"{(spec.get('Labels') or {}).get(NAMESPACE_LABEL, '')}_"  # Swarm names services <stack>_<service>
    container = status.get("ContainerStatus") or {}
    state = str(status.get("State") or "")
    labels = {
        **(spec.get("Labels") or {}),
        SERVICE_LABEL: service.removeprefix(prefix),
        NODE_LABEL: str(task.get("NodeID") or _pinned_node(task)),
    }
    raw: ContainerSummary = {
        "Id": container.get("ContainerID") or "",
        "Names": [f"/{service}.{task.get('Slot') or task.get('NodeID')}.{task.get('ID')}"],
        "Image": spec.get("Image", ""),
        "Created": _created(task),
        "Labels": labels,
        "Ports": _ports((status.get("PortStatus") or {}).get("Ports") or [], labelled_ports(spec.get("Labels") or {})),
    }
    if state == "running":
        raw["State"] = "running"
    elif state in ENDED:
        raw["State"] = ENDED[state]
        raw["Status"] = f"Exited ({int(container.get('ExitCode') or 0)})"
        raw["Error"] = status.get("Err") or ""
    else:
        raw["State"] = "created"  # scheduled, pulling or starting on its machine
    return raw


def _ports(published: list[Mapping[str, Any]], exposed: set[int]) -> list[PortSummary]:
    """Each published port once: Swarm lists a host-mode port once per address
    family it bound (seen on Engine 20.10: the same entry twice). Then each
    `expose:` port the agent's label names (runtime/declared_ports.py) that
    is not published, unpublished as Docker lists one on one machine: so it
    gets its tunnel as it would there."""
    seen = {
        (port.get("TargetPort"), port.get("Protocol") or "tcp", port.get("PublishedPort")): None for port in published
    }
    listed = cast(
        "list[PortSummary]",
        [
            {"PrivatePort": target, "PublicPort": public, "Type": protocol, "IP": "0.0.0.0"}
            for target, protocol, public in seen
        ],
    )
    tcp = {target for target, protocol, _ in seen if protocol == "tcp"}
    return listed + [{"PrivatePort": port, "Type": "tcp"} for port in sorted(exposed - tcp)]


def _pinned_node(task: Mapping[str, Any]) -> str:
    """The node the agent pinned the task's service to (core/swarm/stack_file.py):
    where a task waits to run while that machine is away (it has no NodeID)."""
    constraints = (((task.get("Spec") or {}).get("Placement") or {}).get("Constraints")) or []
    for constraint in constraints:
        key, _, value = str(constraint).partition("==")
        if key.strip() == "node.id" and value.strip():
            return value.strip()
    return ""


def _version(task: Mapping[str, Any]) -> int:
    """The manager's change counter: a later task of a slot has a higher one."""
    return int((task.get("Version") or {}).get("Index") or 0)


def _created(task: Mapping[str, Any]) -> int:
    """The task's creation time in whole seconds (Docker's list gives `Created` so)."""
    try:
        when = datetime.strptime(str(task.get("CreatedAt") or "")[:19], "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return 0
    return int(when.replace(tzinfo=timezone.utc).timestamp())

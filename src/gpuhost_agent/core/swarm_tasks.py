"""A Swarm environment as the agent's own words: which GPUs the environment
has and on which machine, and a stack's containers on every machine. Pure:
the manager's answers in (`GET /nodes`, `/services`, `/tasks`), decisions out.

GPUs: each node advertises its GPUs as named generic resources of kind
`NVIDIA-GPU` (dockerd's `node-generic-resources`, the UUIDs NVIDIA's own
Swarm guide uses). The leader reads them from the manager, which sees every
node; a GPU of a node that is down, drained or paused is listed as out of
service, so it leaves `availableGPUs` and is not handed out.

Containers: a task is one container of a service on one machine. The
manager knows every task, including those on other machines, so the
container list is built from tasks (the newest of each service's slot) in
the shape of Docker's container list, and then goes through the same
seed shaping as on one machine (core/containers.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from gpuhost_agent.core.containers import SERVICE_LABEL
from gpuhost_agent.core.gpu_allocation import GpuSlot

GPU_KIND = "NVIDIA-GPU"
NAMESPACE_LABEL = "com.docker.stack.namespace"
NODE_LABEL = "com.docker.swarm.node.id"
# Task states (swarmkit's TaskState) as Docker's container states.
STARTING = {"new", "pending", "assigned", "accepted", "preparing", "ready", "starting", "allocated"}
ENDED = {"complete": "exited", "failed": "exited", "shutdown": "exited", "rejected": "dead", "orphaned": "dead"}


def node_gpus(nodes: list[Mapping[str, Any]]) -> tuple[list[GpuSlot], dict[str, str]]:
    """(every GPU of the environment, GPU UUID -> node id). A GPU on a node
    that cannot run tasks now is a slot out of service, with the reason."""
    slots: list[GpuSlot] = []
    where: dict[str, str] = {}
    for node in sorted(nodes, key=lambda n: str(n.get("ID"))):
        node_id = str(node.get("ID") or "")
        down = _why_down(node)
        resources = ((node.get("Description") or {}).get("Resources") or {}).get("GenericResources") or []
        for resource in resources:
            named = resource.get("NamedResourceSpec") or {}
            uuid = str(named.get("Value") or "")
            if named.get("Kind") != GPU_KIND or not uuid or uuid in where:
                continue
            where[uuid] = node_id
            slots.append(GpuSlot(uuid, healthy=not down, reason=down))
    return slots, where


def _why_down(node: Mapping[str, Any]) -> str:
    hostname = (node.get("Description") or {}).get("Hostname") or str(node.get("ID"))[:12]
    state = (node.get("Status") or {}).get("State")
    availability = (node.get("Spec") or {}).get("Availability")
    if state != "ready":
        return f"machine {hostname} is {state or 'unknown'} in the Swarm"
    if availability != "active":
        return f"machine {hostname} is {availability} in the Swarm"
    return ""


def stack_containers(
    project: str, services: list[Mapping[str, Any]], tasks: list[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The stack's containers on every machine, as Docker's container list
    gives them on one: the newest task of each service's slot."""
    names = {str(s.get("ID")): str((s.get("Spec") or {}).get("Name") or "") for s in services}
    newest: dict[tuple[str, object], Mapping[str, Any]] = {}
    for task in tasks:
        key = (str(task.get("ServiceID")), task.get("Slot") or task.get("NodeID"))
        if key not in newest or _version(task) >= _version(newest[key]):
            newest[key] = task
    prefix = f"{project}_"
    return [
        _container(task, names.get(str(task.get("ServiceID")), "?"), prefix)
        for task in newest.values()
        if (task.get("Status") or {}).get("State") not in ("orphaned", "remove")
    ]


def _container(task: Mapping[str, Any], service: str, prefix: str) -> dict[str, Any]:
    status = task.get("Status") or {}
    spec = (task.get("Spec") or {}).get("ContainerSpec") or {}
    container = status.get("ContainerStatus") or {}
    state = str(status.get("State") or "")
    labels = {
        **(spec.get("Labels") or {}),
        SERVICE_LABEL: service.removeprefix(prefix),
        NODE_LABEL: str(task.get("NodeID") or ""),
    }
    raw: dict[str, Any] = {
        "Id": container.get("ContainerID") or "",
        "Names": [f"/{service}.{task.get('Slot') or task.get('NodeID')}.{task.get('ID')}"],
        "Image": spec.get("Image", ""),
        "Created": _created(task),
        "Labels": labels,
        "Ports": _ports((status.get("PortStatus") or {}).get("Ports") or []),
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


def _ports(published: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each published port once: Swarm lists a host-mode port once per address
    family it bound (seen on Engine 20.10: the same entry twice)."""
    seen = {
        (port.get("TargetPort"), port.get("Protocol") or "tcp", port.get("PublishedPort")): None for port in published
    }
    return [
        {"PrivatePort": target, "PublicPort": public, "Type": protocol, "IP": "0.0.0.0"}
        for target, protocol, public in seen
    ]


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

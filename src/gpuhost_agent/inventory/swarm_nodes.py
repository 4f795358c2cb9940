"""The machines of a Swarm environment, as its leader reports them.

On a Swarm manager the leader asks the manager for every node (`GET
/nodes`): its id, hostname, role, whether it can take tasks, and the GPUs
it advertises as named generic resources of kind `NVIDIA-GPU` (dockerd's
`node-generic-resources`, as in NVIDIA's guide for Swarm). That is the
environment's part of systemData (`environment`): the marketplace's
`totalGPUs` counts these GPUs, and the leader's GPU ledger hands them out
(runtime/swarm_tasks.py).

Each node also carries its `machine`: for the leader's own, a pointer to the
report's top level (`{"this": true}`); for another, the systemData its agent
reported (inventory/machine_report.py) or why there is none. The leader
judges each machine's report against the marketplace's requirements
(`machines_check`): the environment is compliant only when every machine
that reported is. A machine whose agent is silent is named, not failed: its
containers still run, but terminals, SSH and tunnels there wait for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuhost_agent.protocol.wire_system import EnvironmentFacts, EnvironmentNode, MachineFigures
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError

GPU_KIND = "NVIDIA-GPU"


async def environment_facts(engine: DockerEngine) -> EnvironmentFacts:
    """{"nodes": [...], "gpus": N, "error": None}, or the reason the manager could not be asked."""
    try:
        nodes = await engine.swarm_list("nodes")
    except EngineError as exc:
        return {"nodes": [], "gpus": 0, "error": f"the Swarm manager could not list its nodes: {exc}"}
    shaped = nodes_facts(nodes)
    return {"nodes": shaped, "gpus": sum(len(node["gpus"]) for node in shaped), "error": None}


def nodes_facts(nodes: Sequence[Mapping[str, Any]]) -> list[EnvironmentNode]:
    """Each node once, by id; each GPU UUID on the first node (by id) that names it."""
    seen: set[str] = set()
    shaped: list[EnvironmentNode] = []
    for node in sorted(nodes, key=lambda n: str(n.get("ID"))):
        description = node.get("Description") or {}
        gpus = []
        for resource in (description.get("Resources") or {}).get("GenericResources") or []:
            named = resource.get("NamedResourceSpec") or {}
            uuid = str(named.get("Value") or "")
            if named.get("Kind") == GPU_KIND and uuid and uuid not in seen:
                seen.add(uuid)
                gpus.append(uuid)
        shaped.append(
            {
                "nodeId": str(node.get("ID") or ""),
                "hostname": description.get("Hostname") or "",
                "role": (node.get("Spec") or {}).get("Role") or "",
                "state": (node.get("Status") or {}).get("State") or "unknown",
                "availability": (node.get("Spec") or {}).get("Availability") or "unknown",
                "gpus": gpus,
            }
        )
    return shaped


def attach_machines(
    environment: EnvironmentFacts, own_node: str | None, reports: Mapping[str, Mapping[str, Any]]
) -> None:
    """Each node's `machine`, from the agents' reports by node id."""
    for node in environment["nodes"]:
        if node["nodeId"] == own_node:
            node["machine"] = {"this": True}
            continue
        report = reports.get(node["nodeId"]) or {}
        data = report.get("systemData")
        node["machine"] = (
            {"systemData": data} if isinstance(data, dict) else {"error": str(report.get("error") or "no report")}
        )


def live_figures(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, MachineFigures]:
    """A heartbeat's `machines`: each other machine's GPU figures, or why none."""
    shaped: dict[str, MachineFigures] = {}
    for node, report in reports.items():
        gpus = (report.get("telemetry") or {}).get("gpus")
        shaped[node] = {"gpus": gpus} if isinstance(gpus, list) else {"error": str(report.get("error") or "no figures")}
    return shaped

"""The sizes and disks of a Swarm environment's machines, read from the
leader's facts (each machine's own report, inventory/machine_report.py):
the rental's share of each machine it has GPUs on, and a machine too full
for the stack to start on it."""

from __future__ import annotations

from collections.abc import Mapping

from gpuhost_agent.core.sandbox.context import disk_floor_problem, machine_of, rental_share
from gpuhost_agent.inventory.environment import node_host, node_label, runs_the_leader
from gpuhost_agent.protocol.wire_system import SystemData


def machine_shares(facts: SystemData, gpu_nodes: Mapping[str, str], uuids: list[str]) -> dict[str, tuple[float, int]]:
    """A Swarm environment's rental: its share of each machine it has GPUs on,
    sized from that machine's own report (inventory/machine_report.py). A
    machine whose agent did not report is left out: the leader's own machine
    stands in for it, as for the rental's services that use no GPU."""
    shares = {}
    for node in (facts.get("environment") or {}).get("nodes") or []:
        held = sum(1 for uuid in uuids if gpu_nodes.get(uuid) == node.get("nodeId"))
        host = node_host(facts, node)
        if held and host is not None and host.get("cpu"):
            shares[str(node["nodeId"])] = rental_share(machine_of(host, len(node.get("gpus") or [])), held)
    return shares


def machines_floor_problem(facts: SystemData, nodes: set[str], floor_bytes: int) -> str | None:
    """Why a Swarm stack may not start: a machine it would run on, other than
    the leader's own (measured at the deploy), has less free disk than the
    host's floor as its agent reported it at the leader's last probe
    (inventory/machine_report.py; every systemDataSeconds). A machine that
    did not report is not judged."""
    for node in (facts.get("environment") or {}).get("nodes") or []:
        if node.get("nodeId") not in nodes or runs_the_leader(node):
            continue
        storage = (node_host(facts, node) or {}).get("storage") or {}
        full = disk_floor_problem(storage, floor_bytes)
        if full:
            return full.replace("the host's disk", f"machine {node_label(node)}'s disk", 1)
    return None

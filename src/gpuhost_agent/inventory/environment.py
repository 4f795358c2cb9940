"""The environment's machines as systemData holds them (`environment`,
written on a Swarm environment's leader by inventory/swarm_nodes.py): pure
readers that any part may use, since on one machine there is no
`environment` and each answers as for this machine alone.

Each node carries its `machine`: for the leader's own, a pointer to the
report's top level (`{"this": true}`); for another, the systemData its agent
reported (inventory/machine_report.py) or why there is none. The other
machines' reports are judged against the marketplace's requirements
(`machines_check`): the environment is compliant only when every machine
that reported is. A machine whose agent is silent is named, not failed: its
containers still run, but terminals, SSH and tunnels there wait for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from gpuhost_agent.inventory import compliance
from gpuhost_agent.inventory.machines import MachineDisk, storage_total, this_machine_disks
from gpuhost_agent.protocol.requirements import Requirements
from gpuhost_agent.protocol.wire_system import HostFacts, SystemData


def machines_check(system_data: Mapping[str, Any], req: Requirements) -> compliance.Check | None:
    """The other machines' own checks, as one (None on a machine of its own)."""
    environment = system_data.get("environment") or {}
    others = [node for node in environment.get("nodes") or [] if not runs_the_leader(node)]
    if not environment or not others:
        return None
    failed: list[str] = []
    silent: list[str] = []
    fine: list[str] = []
    for node in others:
        name = node_label(node)
        data = (node.get("machine") or {}).get("systemData")
        if not isinstance(data, dict):
            silent.append(name)
            continue
        bad = [check.id for check in compliance.evaluate(data, req) if not check.ok]
        (failed if bad else fine).append(f"{name} ({', '.join(bad)})" if bad else name)
    unheard = f"; no report from {', '.join(silent)} (is its agent running, GPUHOST_SWARM=worker?)" if silent else ""
    if failed:
        summary = f"not compliant: {'; '.join(failed)}{unheard}"
        remedy = "run `gpuhost-agent doctor` on each machine named and fix what it says"
        return compliance.Check("swarm-machines", False, summary, remedy)
    if not fine:
        return compliance.Check("swarm-machines", True, f"skipped: {unheard[2:]}", skipped=True)
    return compliance.Check("swarm-machines", True, f"the other machines are compliant: {', '.join(fine)}{unheard}")


def other_nodes(system_data: Mapping[str, Any]) -> list[str]:
    """The ids of the environment's machines but the leader's own."""
    nodes = (system_data.get("environment") or {}).get("nodes") or []
    return [str(node["nodeId"]) for node in nodes if not runs_the_leader(node)]


def node_host(facts: Mapping[str, Any], node: Mapping[str, Any]) -> HostFacts | None:
    """A node's `host` facts: the leader's own for its node, else the one its
    agent reported (attach_machines), None when it did not report."""
    machine = node.get("machine") or {}
    host = facts.get("host") if machine.get("this") else (machine.get("systemData") or {}).get("host")
    return cast(HostFacts, host) if isinstance(host, dict) else None


def environment_disks(facts: SystemData) -> list[MachineDisk]:
    """Every machine's disk of the environment (the leader's facts carry each
    one's own report); this machine's alone while no node is known."""
    nodes = (facts.get("environment") or {}).get("nodes") or []
    if not nodes:
        return this_machine_disks(facts)
    disks = []
    for node in nodes:
        this = runs_the_leader(node)
        host = node_host(facts, node)
        name = f"{node_label(node)}'s disk"
        gpus = frozenset(str(uuid) for uuid in node.get("gpus") or [])
        disks.append(MachineDisk(str(node.get("nodeId")), name, storage_total(host), gpus, this))
    return disks


def node_label(node: Mapping[str, Any]) -> str:
    """How a machine is named to the host and the renter: its hostname, or its node id's start."""
    return node.get("hostname") or str(node.get("nodeId"))[:12]


def runs_the_leader(node: Mapping[str, Any]) -> bool:
    """The node the leader runs on (attach_machines marks it)."""
    return bool((node.get("machine") or {}).get("this"))

"""Which physical GPUs a rental gets. Pure: data in, decision out.

A rental gets its GPUs, by UUID, when its first stack deploys, and keeps them
for its life: all its stacks share them, and no other rental can have them
until it ends. UUIDs, not indexes: an index can change across a reboot or a
driver reload, a UUID names one board.

In a Swarm environment the GPUs are every machine's (systemData's
`environment`, inventory/swarm_nodes.py), each slot knowing its machine, and
a rental's GPUs are taken from one machine when one has enough free: a
container runs on one machine, so a service's GPUs must be there together.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost_agent.errors import Refusal
from gpuhost_agent.protocol.wire_system import EnvironmentFacts, NvmlInventory, SystemData


class NotEnoughGpus(Refusal, ValueError):
    """The message is meant for the renter."""


@dataclass(frozen=True)
class GpuSlot:
    uuid: str
    healthy: bool = True
    reason: str = ""  # why not healthy
    machine: str = ""  # the Swarm node id, in an environment of several machines


def slots_from_facts(facts: SystemData) -> list[GpuSlot]:
    """The GPUs the agent hands out: the environment's when it spans machines,
    else this machine's."""
    environment = facts.get("environment")
    if environment:
        return environment_slots(environment)
    return slots_from_inventory(facts.get("nvml") or {})


def environment_slots(environment: EnvironmentFacts) -> list[GpuSlot]:
    """Every machine's GPUs; those of a machine that cannot take tasks now
    (down, drained, paused) are out of service, with the reason."""
    slots: list[GpuSlot] = []
    for node in environment.get("nodes") or []:
        down = ""
        if node.get("state") != "ready" or node.get("availability") != "active":
            how = node.get("state") if node.get("state") != "ready" else node.get("availability")
            down = f"machine {node.get('hostname') or node.get('nodeId', '')[:12]} is {how} in the Swarm"
        slots.extend(GpuSlot(uuid, not down, down, node.get("nodeId", "")) for uuid in node.get("gpus") or [])
    return slots


def slots_from_inventory(nvml: NvmlInventory) -> list[GpuSlot]:
    """GPUs as the probe saw them; one that cannot be read or has uncorrected
    memory errors is not handed out."""
    slots: list[GpuSlot] = []
    for gpu in nvml.get("gpus") or []:
        if not gpu.get("uuid"):
            continue
        if gpu.get("error"):
            slots.append(GpuSlot(gpu["uuid"], False, gpu["error"]))
        elif (gpu.get("eccUncorrectedErrors") or 0) > 0:
            slots.append(GpuSlot(gpu["uuid"], False, "uncorrected ECC memory errors"))
        else:
            slots.append(GpuSlot(gpu["uuid"]))
    return slots


def allocate(slots: list[GpuSlot], assignments: dict[str, list[str]], rental_id: str, count: int) -> list[str]:
    """The rental's GPUs: its existing assignment, else `count` free healthy GPUs
    in the machine's order. Raises NotEnoughGpus with the reason."""
    if rental_id in assignments:
        return list(assignments[rental_id])
    if count <= 0:
        return []
    taken = {uuid for uuids in assignments.values() for uuid in uuids}
    free = [slot.uuid for slot in slots if slot.healthy and slot.uuid not in taken]
    by_machine: dict[str, list[str]] = {}
    for slot in slots:
        if slot.uuid in free:
            by_machine.setdefault(slot.machine, []).append(slot.uuid)
    fitting = [uuids for uuids in by_machine.values() if len(uuids) >= count]
    if fitting:  # the machine with the fewest free GPUs that still fits: larger gaps stay whole
        return min(fitting, key=len)[:count]
    if len(free) < count:
        unhealthy = sum(1 for slot in slots if not slot.healthy)
        detail = f"{len(free)} of the machine's {len(slots)} GPU(s) are free"
        if unhealthy:
            detail += f", {unhealthy} out of service"
        raise NotEnoughGpus(
            f"the rental needs {count} GPU(s) but only {detail}; try again when another rental has ended"
        )
    return free[:count]

"""Which physical GPUs a rental gets. Pure: data in, decision out.

A rental gets its GPUs, by UUID, when its first stack deploys, and keeps them
for its life: all its stacks share them, and no other rental can have them
until it ends. UUIDs, not indexes: an index can change across a reboot or a
driver reload, a UUID names one board.
"""

from __future__ import annotations

from dataclasses import dataclass


class NotEnoughGpus(ValueError):
    """The message is meant for the renter."""


@dataclass(frozen=True)
class GpuSlot:
    uuid: str
    healthy: bool = True
    reason: str = ""  # why not healthy


def slots_from_inventory(nvml: dict) -> list[GpuSlot]:
    """GPUs as the probe saw them; one that cannot be read or has uncorrected
    memory errors is not handed out."""
    slots = []
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
    if len(free) < count:
        unhealthy = sum(1 for slot in slots if not slot.healthy)
        detail = f"{len(free)} of the machine's {len(slots)} GPU(s) are free"
        if unhealthy:
            detail += f", {unhealthy} out of service"
        raise NotEnoughGpus(
            f"the rental needs {count} GPU(s) but only {detail}; try again when another rental has ended"
        )
    return free[:count]

"""Whether a stack's images fit before they are pulled: their
size from the registry's manifest (runtime/image_manifest.py) against the
host's disk floor and the rental's disk share, with a refusal naming the
numbers, instead of a pull that fails half-way or fills the disk the host's
own system needs.

The size is the layers' compressed size, what the registry says and what
is fetched. Unpacked, an image takes more (typically 2 to 3 times as much;
a layer of zeros far more), but how much cannot be told before it is
unpacked, so the compressed size is used as it is: a lower bound. What
passes this check and still fills the disk is met by the disk floor's own
check at the next deploy and by the rental's disk watch (core/disk_watch.py).
An image some layers of which the host already has counts in full.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from gpuhost_agent.core.gpus.allocation import slots_from_inventory
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.rentals.disk_share import disk_share
from gpuhost_agent.inventory.host_probe import storage
from gpuhost_agent.protocol.wire_system import StorageFacts, SystemData

GB = 1000**3  # as registries and `docker images` count


@dataclass(frozen=True)
class Room:
    free: int | None  # bytes free on Docker's disk now (None: not seen, e.g. an engine elsewhere)
    floor: int  # GPUHOST_DISK_FLOOR (0: none)
    share: int  # the rental's disk share (0: unknown)


def _gb(size: int) -> str:
    return f"{size / GB:.2f} GB"


def room_problem(sizes: Mapping[str, int], room: Room) -> str | None:
    """Why the images of `sizes` (reference -> compressed bytes) may not be
    pulled now; None when they fit (or nothing is known)."""
    total = sum(sizes.values())
    if not total:
        return None
    named = ", ".join(f"{image!r} ({_gb(size)})" for image, size in sorted(sizes.items()))
    what = f"the stack's images to pull, {named}, take at least {_gb(total)} compressed (their registry's manifest)"
    if room.share and total > room.share:
        return (
            f"{what}, more than this rental's disk share of {_gb(room.share)} (GPUHOST_RENTAL_DISK, or its part of "
            "the host's disk by GPUs): use a smaller image, or a rental with more GPUs"
        )
    if room.floor and room.free is not None and room.free - total < room.floor:
        return (
            f"{what}; Docker's disk has {_gb(room.free)} free, which would leave less than the host's floor of "
            f"{_gb(room.floor)} (GPUHOST_DISK_FLOOR): no room for them until the host frees space"
        )
    return None


LARGEST_IMAGE = 200 * 1000**3  # compressed: no published image comes near (GPU images are 5 to 30 GB)


def roomy(room: Room, images: int) -> bool:
    """Whether `images` images could not fail the check whatever their size:
    then the registry is not asked (a manifest GET counts against a
    registry's pull limits, Docker Hub's among them)."""
    needed = LARGEST_IMAGE * images
    room_above_floor = None if room.free is None else room.free - room.floor
    return (not room.share or room.share >= needed) and (room_above_floor is None or room_above_floor >= needed)


class DiskRoom:
    """The room a rental's pull has now: Docker's disk measured at the call,
    the rental's share as the sandbox computes it (core/disk_watch.py)."""

    def __init__(
        self,
        machine_facts: Callable[[], Awaitable[SystemData]],
        ledger: GpuLedger,
        *,
        floor_bytes: int,
        rental_disk_bytes: int | None,
    ):
        self.machine_facts, self.ledger = machine_facts, ledger
        self.floor_bytes, self.rental_disk_bytes = floor_bytes, rental_disk_bytes

    async def _disk(self) -> tuple[SystemData, StorageFacts]:
        facts = await self.machine_facts()
        root = (((facts.get("host") or {}).get("docker") or {}).get("rootDir")) or "/var/lib/docker"
        return facts, await asyncio.to_thread(storage, root)

    async def free(self) -> tuple[int | None, int]:
        """(bytes free on Docker's disk now, the floor): what eviction needs (core/images/cache.py)."""
        _facts, disk = await self._disk()
        free = disk.get("freeBytes")
        return (free if isinstance(free, int) else None), self.floor_bytes

    async def room(self, rental_id: str) -> Room:
        facts, disk = await self._disk()
        free, total = disk.get("freeBytes"), disk.get("totalBytes")
        machine_gpus = len(slots_from_inventory(facts.get("nvml") or {}))
        rental_gpus = len(self.ledger.assignments.get(rental_id) or ())
        share = (
            disk_share(total, self.floor_bytes, rental_gpus, machine_gpus, self.rental_disk_bytes)
            if isinstance(total, int)
            else self.rental_disk_bytes or 0
        )
        return Room(free if isinstance(free, int) else None, self.floor_bytes, share)

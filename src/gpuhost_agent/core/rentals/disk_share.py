"""How much of Docker's disk one rental may use: the host's fixed share, or
the rental's part of the usable disk by its GPUs (a rental without GPUs a
tenth). The sandbox asks the kernel to hold it where it can, the image checks
and the disk watch measure against it."""

from __future__ import annotations

GPU_LESS_FRACTION = 0.1


def disk_share(total: int, floor: int, rental_gpus: int, machine_gpus: int, fixed: int | None) -> int:
    """Bytes of Docker's disk one rental may use."""
    if fixed:
        return fixed
    usable = max(0, total - floor)
    if rental_gpus <= 0 or machine_gpus <= 0:
        return int(usable * GPU_LESS_FRACTION)
    return int(usable * min(1.0, rental_gpus / machine_gpus))

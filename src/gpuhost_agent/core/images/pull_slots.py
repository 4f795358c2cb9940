"""How many pulls run at once, and for how long.

dockerd downloads at most `max-concurrent-downloads` layers at once (3 by
default) for the whole daemon: pulls beyond that wait in the engine, their
layers `Waiting`, and a deploy waiting on them would fail as stalled. So
the agent starts at most `per_host` pulls at once, and at most `per_rental`
for any one rental: one renter's images (32 services, each with its own
tag, redeployed again and again) never hold every slot. The others queue in
the order asked; a queued pull is not started, so the stall bound does not
run for it, and the renter reads `waiting for a pull slot`.

A pull also has an overall deadline: a registry that sends a byte within
every stall bound would otherwise hold a slot forever. The deadline is a
minimum average rate over the image's size when its manifest said it
(room.py's size check), else the host's cap (GPUHOST_PULL_MAX_SECONDS).
Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

PER_HOST = 3  # below or at dockerd's max-concurrent-downloads (3 unless the host changed it)
PER_RENTAL = 2  # so two rentals at least always pull side by side
MIN_BYTES_PER_SECOND = 1_000_000  # 1 MB/s: a 10 GB image gets 2 h 47 min
GRACE_SECONDS = 120.0  # added to the rate's time: a registry's token, the engine's unpacking


def startable(
    queued: Iterable[tuple[str, str]],
    running: Mapping[str, int],
    *,
    per_host: int = PER_HOST,
    per_rental: int = PER_RENTAL,
) -> list[str]:
    """Of the queued (image, rental) pairs, in the order asked, the images
    to start now, given how many pulls each rental has `running`."""
    counts, started = dict(running), []
    total = sum(counts.values())
    for image, rental in queued:
        if total >= per_host:
            break
        if counts.get(rental, 0) >= per_rental:
            continue
        counts[rental] = counts.get(rental, 0) + 1
        total += 1
        started.append(image)
    return started


def deadline_seconds(size: int | None, max_seconds: float) -> float:
    """How long a pull may take: at the minimum average rate over `size`
    (the manifest's compressed size) when known, never over the host's cap."""
    if not size:
        return max_seconds
    return min(max_seconds, GRACE_SECONDS + size / MIN_BYTES_PER_SECOND)

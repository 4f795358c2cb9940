"""Renters' images kept between rentals, and evicted least recently used
when Docker's disk needs room (issue 34).

A stack's removal and a rental's end take down containers, networks and
volumes, never images (`compose down` without `--rmi`): the next rental of
the same template starts without a pull. What the agent may evict is only
what it pulled itself for a renter (core/images/pulls.py), recorded with
when a deploy last used it (`images.json` in the state directory, so the
order survives a restart); the host's own images and any image it did not
pull are never touched. An image any container uses, running or stopped,
is never evicted (and the engine itself refuses to remove one).

Eviction runs when the disk floor needs room: before a deploy's own floor
check (the sandbox refuses every deploy while Docker's disk is below it)
and before a pull whose size would take the disk below it. Which images go
is `evictions`, a pure decision; each removal is logged.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuhost_agent.common.json_files import write_json_atomically
from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.engine import DockerEngine, EngineError

log = get_logger(__name__)

MAX_RECORDED = 10_000  # references kept in the record; the least recently used past this are forgotten
FileRoom = Callable[[], Awaitable[tuple[int | None, int]]]  # () -> (free bytes on Docker's disk, the floor)


@dataclass(frozen=True)
class Kept:
    reference: str
    image_id: str
    size: int  # unpacked, as the engine counts it
    last_used: float


def evictions(kept: list[Kept], in_use: set[str], needed: int) -> list[Kept]:
    """The images to remove to free `needed` bytes: least recently used
    first, none whose image any container uses; all that may go when even
    they are not enough (the caller then says what is still missing).
    Several references to one image count its size once."""
    chosen: list[Kept] = []
    freed, counted = 0, set()
    for image in sorted(kept, key=lambda k: (k.last_used, k.reference)):
        if freed >= needed:
            break
        if image.image_id in in_use:
            continue
        chosen.append(image)
        if image.image_id not in counted:
            counted.add(image.image_id)
            freed += image.size
    return chosen


class ImageCache:
    def __init__(self, engine: DockerEngine, record: Path, room: FileRoom):
        self.engine, self.path, self.room = engine, record, room
        self._used: dict[str, float] = {}
        self._loaded = False
        self._lock = asyncio.Lock()  # one eviction at a time
        self._saving = asyncio.Lock()  # one write of the record at a time (they share a temporary file)

    async def _load_once(self) -> None:
        if not self._loaded:
            self._used = {**await asyncio.to_thread(self._load), **self._used}
            self._loaded = True

    def _load(self) -> dict[str, float]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}

    async def _save(self) -> None:
        """The record written; a failure is logged (the order is then lost at a restart, nothing else)."""
        if len(self._used) > MAX_RECORDED:
            self._used = dict(sorted(self._used.items(), key=lambda item: item[1])[-MAX_RECORDED:])
        async with self._saving:
            try:
                await asyncio.to_thread(write_json_atomically, self.path, dict(self._used))
            except OSError as exc:
                log.warning("image_record_not_saved", path=str(self.path), error=str(exc))

    async def recorded(self) -> Mapping[str, float]:
        await self._load_once()
        return dict(self._used)

    async def pulled(self, references: list[str]) -> None:
        """Images the agent pulled for a renter: its to evict, used now."""
        await self._load_once()
        if references:
            now = time.time()
            self._used.update({reference: now for reference in references})
            await self._save()

    async def used(self, references: list[str]) -> None:
        """A deploy used these: the ones the agent pulled are used now."""
        await self._load_once()
        known = [reference for reference in references if reference in self._used]
        await self.pulled(known)

    async def make_room(self, needed: int = 0) -> None:
        """Evict until Docker's disk keeps its floor with `needed` bytes more
        taken; nothing when it already does or nothing may go."""
        async with self._lock:
            free, floor = await self.room()
            await self._load_once()
            if not floor or free is None or free - needed >= floor or not self._used:
                return
            try:
                images, in_use = await self.engine.image_inventory()
            except EngineError as exc:
                log.warning("image_eviction_failed", error=str(exc))
                return
            for reference in [r for r in self._used if r not in images]:  # gone by other means
                del self._used[reference]
            kept = [Kept(r, images[r][0], images[r][1], at) for r, at in self._used.items()]
            missing = floor - (free - needed)
            for image in evictions(kept, in_use, missing):
                try:
                    await self.engine.remove_image(image.reference)
                except EngineError as exc:  # a container started from it since: it stays
                    log.info("image_eviction_skipped", image=image.reference, error=str(exc))
                    continue
                self._used.pop(image.reference, None)
                log.info(
                    "image_evicted",
                    image=image.reference,
                    size_bytes=image.size,
                    last_used=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(image.last_used)),
                    reason=f"Docker's disk below the floor by {missing} bytes",
                )
            await self._save()

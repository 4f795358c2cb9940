"""Renters' images kept between rentals, and evicted least recently used
when Docker's disk needs room.

A stack's removal and a rental's end take down containers, networks and
volumes, never images (`compose down` without `--rmi`): the next rental of
the same template starts without a pull. What the agent may evict is only
what it pulled itself for a renter (core/images/pulls.py), recorded with
when a deploy last used it (`images.json` in the state directory, so the
order survives a restart); the host's own images and any image it did not
pull are never touched. An image any container uses, running or stopped,
is never evicted (and the engine itself refuses to remove one).

Each reference is recorded with the id of the image it pulled (asked of the
engine right after the pull) and evicted by that id: the renter's spelling
(`busybox`, `docker.io/library/python:3.12`, a digest) is never the engine's
tag (`busybox:latest`, `python:3.12`), so looking the reference up among the
tags took such images as gone and kept them for ever.
The removal is never forced: an image that has since got another tag (the
host's own, say) stays.

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
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError

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
        self._ids: dict[str, str] = {}  # the image each reference pulled
        self._loaded = False
        self._lock = asyncio.Lock()  # one eviction at a time
        self._saving = asyncio.Lock()  # one write of the record at a time (they share a temporary file)

    async def _load_once(self) -> None:
        if not self._loaded:
            used, ids = await asyncio.to_thread(self._load)
            self._used, self._ids = {**used, **self._used}, {**ids, **self._ids}
            self._loaded = True

    def _load(self) -> tuple[dict[str, float], dict[str, str]]:
        """{reference: last used}, {reference: image id}; a record of before
        ids (a bare time) has none: such a reference is looked up by tag."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}, {}
        if not isinstance(data, dict):
            return {}, {}
        used, ids = {}, {}
        for key, value in data.items():
            entry = value if isinstance(value, dict) else {"used": value}
            at, image_id = entry.get("used"), entry.get("id")
            if isinstance(at, (int, float)) and not isinstance(at, bool):
                used[str(key)] = float(at)
                if isinstance(image_id, str) and image_id:
                    ids[str(key)] = image_id
        return used, ids

    def _record(self) -> dict[str, float | dict[str, float | str]]:
        return {
            reference: {"used": at, "id": self._ids[reference]} if reference in self._ids else at
            for reference, at in self._used.items()
        }

    async def _save(self) -> None:
        """The record written; a failure is logged (the order is then lost at a restart, nothing else)."""
        if len(self._used) > MAX_RECORDED:
            self._used = dict(sorted(self._used.items(), key=lambda item: item[1])[-MAX_RECORDED:])
            self._ids = {reference: self._ids[reference] for reference in self._used if reference in self._ids}
        async with self._saving:
            try:
                await asyncio.to_thread(write_json_atomically, self.path, self._record())
            except OSError as exc:
                log.warning("image_record_not_saved", path=str(self.path), error=str(exc))

    async def recorded(self) -> Mapping[str, float]:
        await self._load_once()
        return dict(self._used)

    async def pulled(self, references: list[str]) -> None:
        """Images the agent pulled for a renter: its to evict, used now, each
        with the id of the image the engine now has under it."""
        for reference in references:
            image_id = await self.engine.image_id(reference)
            if image_id:
                self._ids[reference] = image_id
        await self._touch(references)

    async def used(self, references: list[str]) -> None:
        """A deploy used these: the ones the agent pulled are used now."""
        await self._load_once()
        await self._touch([reference for reference in references if reference in self._used])

    async def _touch(self, references: list[str]) -> None:
        await self._load_once()
        if references:
            now = time.time()
            self._used.update({reference: now for reference in references})
            await self._save()

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
            by_id = {image_id: size for image_id, size in images.values()}
            known = {r: self._ids.get(r) or (images[r][0] if r in images else "") for r in self._used}
            for reference in [r for r, image_id in known.items() if image_id not in by_id]:  # gone by other means
                del self._used[reference]
                self._ids.pop(reference, None)
            kept = [Kept(r, known[r], by_id[known[r]], at) for r, at in self._used.items()]
            missing = floor - (free - needed)
            removed: set[str] = set()
            for image in evictions(kept, in_use, missing):
                if image.image_id not in removed:
                    try:
                        await self.engine.remove_image(image.image_id)
                    except EngineError as exc:  # a container started from it since, or another tag: it stays
                        log.info("image_eviction_skipped", image=image.reference, error=str(exc))
                        continue
                    removed.add(image.image_id)
                self._used.pop(image.reference, None)
                self._ids.pop(image.reference, None)
                log.info(
                    "image_evicted",
                    image=image.reference,
                    image_id=image.image_id,
                    size_bytes=image.size,
                    last_used=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(image.last_used)),
                    reason=f"Docker's disk below the floor by {missing} bytes",
                )
            await self._save()

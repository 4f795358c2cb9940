"""Images kept between rentals, evicted least recently used
when the disk floor needs room, never while a container uses them (core/images/cache.py)."""

from __future__ import annotations

import asyncio
import json

from gpuhost_agent.core.images.cache import ImageCache, Kept, evictions
from gpuhost_agent.runtime.engine.client import EngineError

GB = 1000**3


def kept(reference: str, image_id: str, size: int, last_used: float) -> Kept:
    return Kept(reference, image_id, size, last_used)


def test_the_least_recently_used_go_first_and_only_as_many_as_needed():
    images = [kept("new:1", "n", 5 * GB, 300), kept("old:1", "o", 2 * GB, 100), kept("mid:1", "m", 4 * GB, 200)]
    assert [k.reference for k in evictions(images, set(), 1 * GB)] == ["old:1"]
    assert [k.reference for k in evictions(images, set(), 3 * GB)] == ["old:1", "mid:1"]
    assert evictions(images, set(), 0) == []


def test_an_image_a_container_uses_never_goes_even_when_room_is_short():
    images = [kept("old:1", "o", 2 * GB, 100), kept("mid:1", "m", 4 * GB, 200), kept("new:1", "n", 5 * GB, 300)]
    assert [k.reference for k in evictions(images, {"o", "n"}, 100 * GB)] == ["mid:1"]


def test_two_references_to_one_image_count_its_size_once():
    images = [kept("a:1", "x", 2 * GB, 100), kept("b:1", "x", 2 * GB, 101), kept("c:1", "y", 2 * GB, 102)]
    assert [k.reference for k in evictions(images, set(), 3 * GB)] == ["a:1", "b:1", "c:1"]


class FakeEngine:
    def __init__(self, images: dict[str, tuple[str, int]], in_use: set[str]):
        self.images, self.in_use, self.removed = images, in_use, []

    async def image_inventory(self):
        return dict(self.images), set(self.in_use)

    async def image_id(self, reference: str) -> str | None:
        return self.images[reference][0] if reference in self.images else None

    async def remove_image(self, image_id: str) -> None:
        if image_id in self.in_use:
            raise EngineError("conflict: image is being used by a container")
        tags = [tag for tag, (found, _size) in self.images.items() if found == image_id]
        if len(tags) > 1:
            raise EngineError("conflict: image is referenced in multiple repositories")
        self.removed.append(tags[0])
        del self.images[tags[0]]


async def test_eviction_removes_only_what_the_agent_pulled_and_keeps_the_order_across_restarts(tmp_path):
    engine = FakeEngine(
        {"host-own:1": ("h", 9 * GB), "a:1": ("a", 3 * GB), "b:1": ("b", 3 * GB), "c:1": ("c", 3 * GB)}, {"a"}
    )
    free = [10 * GB]

    async def room():
        return free[0], 20 * GB

    record = tmp_path / "images.json"
    cache = ImageCache(engine, record, room)  # type: ignore[arg-type]
    await cache.pulled(["a:1"])
    await cache.pulled(["b:1"])
    await cache.pulled(["c:1"])
    await cache.used(["b:1", "host-own:1"])  # the host's own image is never recorded
    assert set(await cache.recorded()) == {"a:1", "b:1", "c:1"}

    again = ImageCache(engine, record, room)  # type: ignore[arg-type]  # after a restart
    free[0] = 18 * GB  # 2 GB short of the floor
    await again.make_room()
    assert engine.removed == ["c:1"]  # a:1 is older but in use; b:1 was used after c:1
    free[0] = 25 * GB
    await again.make_room(10 * GB)  # a pull of 10 GB: 5 GB short
    assert engine.removed == ["c:1", "b:1"] and "host-own:1" in engine.images and "a:1" in engine.images
    assert set(await again.recorded()) == {"a:1"}


async def test_nothing_goes_while_the_floor_is_kept(tmp_path):
    engine = FakeEngine({"a:1": ("a", 3 * GB)}, set())

    async def room():
        return 30 * GB, 20 * GB

    cache = ImageCache(engine, tmp_path / "images.json", room)  # type: ignore[arg-type]
    await cache.pulled(["a:1"])
    await cache.make_room(5 * GB)
    assert engine.removed == []


async def test_images_are_recorded_by_id_and_evicted_by_it_after_a_restart(tmp_path):
    """The renter's spelling is not the engine's tag; the id recorded at the pull is what goes."""
    engine = FakeEngine({"busybox:latest": ("sha256:b", 3 * GB), "python:3.12": ("sha256:p", 3 * GB)}, set())
    spellings = {"busybox": "sha256:b", "docker.io/library/python:3.12": "sha256:p", "x@sha256:d": "sha256:b"}
    engine.image_id = lambda reference: _answer(spellings.get(reference))  # type: ignore[method-assign]

    async def room():
        return 18 * GB, 20 * GB

    record = tmp_path / "images.json"
    await ImageCache(engine, record, room).pulled(["docker.io/library/python:3.12", "busybox"])  # type: ignore[arg-type]
    again = ImageCache(engine, record, room)  # type: ignore[arg-type]  # after a restart
    await again.make_room()
    assert engine.removed == ["busybox:latest"]  # one needed: the first by name (both used at once)
    assert set(await again.recorded()) == {"docker.io/library/python:3.12"}


async def test_a_record_from_before_ids_still_evicts_by_tag(tmp_path):
    engine = FakeEngine({"a:1": ("a", 3 * GB)}, set())

    async def room():
        return 18 * GB, 20 * GB

    record = tmp_path / "images.json"
    await asyncio.to_thread(record.write_text, json.dumps({"a:1": 100.0, "gone:1": 50.0}))
    await ImageCache(engine, record, room).make_room()  # type: ignore[arg-type]
    assert engine.removed == ["a:1"]


async def _answer(value):
    return value

"""The pull's events folded into what a renter reads, and
one pull per image reference whoever waits on it (core/images)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from gpuhost_agent.core.images.disk_fit import GB, Room, room_problem, roomy
from gpuhost_agent.core.images.pull_progress import MAX_MESSAGE, PullProgress, progress_message
from gpuhost_agent.core.images.pulls import ImagePulls, pullable_images, stalled_message
from gpuhost_agent.core.stack_errors import StackFailed, StackRejected
from gpuhost_agent.runtime.image_manifest import insecure_registry, manifest_size
from gpuhost_agent.runtime.image_pull import PullError, PullStalled

IMAGE = "registry.example:5000/team/model:1"


def events() -> list[dict]:
    """What the engine sends for an image of three layers, one already here."""
    return [
        {"status": "Pulling from team/model", "id": "1"},
        {"status": "Already exists", "id": "aaa"},
        {"status": "Pulling fs layer", "id": "bbb"},
        {"status": "Pulling fs layer", "id": "ccc"},
        {"status": "Waiting", "id": "ccc"},
        {"status": "Downloading", "progressDetail": {"current": 1_000_000, "total": 4_000_000}, "id": "bbb"},
        {"status": "Downloading", "progressDetail": {"current": 500_000, "total": 2_000_000}, "id": "ccc"},
        {"status": "Downloading", "progressDetail": {"current": 3_000_000, "total": 4_000_000}, "id": "bbb"},
        {"status": "Verifying Checksum", "progressDetail": {}, "id": "bbb"},
        {"status": "Download complete", "progressDetail": {}, "id": "bbb"},
        {"status": "Extracting", "progressDetail": {"current": 65536, "total": 4_000_000}, "id": "bbb"},
        {"status": "Pull complete", "progressDetail": {}, "id": "bbb"},
    ]


def test_the_fold_counts_bytes_and_layers_as_docker_pull_shows_them():
    progress = PullProgress(IMAGE)
    assert progress.text() == f"image {IMAGE!r}: starting"
    for event in events()[:8]:
        progress.add(event)
    assert progress.text() == f"image {IMAGE!r}: 3.5 of 6.0 MB, 1 of 3 layers"
    for event in events()[8:]:
        progress.add(event)
    assert progress.text() == f"image {IMAGE!r}: 4.5 of 6.0 MB, 2 of 3 layers"


def test_the_progress_mark_moves_only_with_bytes():
    progress = PullProgress(IMAGE)
    for event in events()[:6]:
        progress.add(event)
    mark = progress.mark()
    progress.add({"status": "Waiting", "id": "ccc"})
    progress.add({"status": "Retrying in 5 seconds", "id": "ccc"})
    progress.add({"status": "Downloading", "progressDetail": {"current": 1_000_000, "total": 4_000_000}, "id": "bbb"})
    assert progress.mark() == mark
    progress.add({"status": "Downloading", "progressDetail": {"current": 1_000_001, "total": 4_000_000}, "id": "bbb"})
    assert progress.mark() != mark


def test_hostile_events_stay_bounded():
    progress = PullProgress(IMAGE)
    for n in range(5000):
        progress.add({"status": "Downloading", "progressDetail": {"current": -5, "total": "x"}, "id": f"l{n}"})
    progress.add("not an event")  # type: ignore[arg-type]
    progress.add({"error": "e" * 10_000})
    assert len(progress.layers) == 1000 and len(progress.error) == 500
    assert progress.total_bytes == 0
    assert len(progress_message([PullProgress("x" * 5000)])) == MAX_MESSAGE


def test_only_images_compose_would_pull_when_missing_are_pulled_first():
    model = {
        "services": {
            "a": {"image": "one:1"},
            "b": {"image": "two:1", "pull_policy": "missing"},
            "c": {"image": "three:1", "pull_policy": "always"},
            "d": {"image": "one:1"},
            "e": {"build": "."},
        }
    }
    assert pullable_images(model) == ["one:1", "two:1"]


class FakePulls:
    """A pull function that blocks until the test lets it finish."""

    def __init__(self, outcome: BaseException | None = None):
        self.calls: list[str] = []
        self.release = threading.Event()
        self.outcome = outcome

    def __call__(self, reference, on_event, _mark, _stall) -> None:
        self.calls.append(reference)
        for event in events():
            on_event(event)
        self.release.wait(10)
        if self.outcome is not None:
            raise self.outcome


async def test_two_deploys_of_one_image_share_one_pull_and_both_hear_its_progress():
    fake = FakePulls()
    pulls = ImagePulls(fake, stall_seconds=5, report_seconds=0.05)
    heard: dict[str, list[str]] = {"a": [], "b": []}
    first = asyncio.create_task(pulls.fetch([IMAGE], heard["a"].append))
    second = asyncio.create_task(pulls.fetch([IMAGE], heard["b"].append))
    await asyncio.sleep(0.3)
    fake.release.set()
    await asyncio.gather(first, second)
    assert fake.calls == [IMAGE] and pulls.started == 1
    for said in heard.values():
        assert any("4.5 of 6.0 MB, 2 of 3 layers" in text for text in said), said
        assert len(said) == len(set(said))  # only changes are said


async def test_a_cancelled_deploy_does_not_cancel_the_pull_another_waits_on():
    fake = FakePulls()
    pulls = ImagePulls(fake, stall_seconds=5, report_seconds=0.05)
    first = asyncio.create_task(pulls.fetch([IMAGE], lambda _text: None))
    second = asyncio.create_task(pulls.fetch([IMAGE], lambda _text: None))
    await asyncio.sleep(0.1)
    first.cancel()
    await asyncio.sleep(0.1)
    assert not second.done()
    fake.release.set()
    await asyncio.wait_for(second, 5)
    assert fake.calls == [IMAGE]
    # Done: the next deploy needing it starts a pull of its own (the caller asks only for missing images).
    fake.release.set()
    await pulls.fetch([IMAGE], lambda _text: None)
    assert fake.calls == [IMAGE, IMAGE]


async def test_a_stalled_pull_fails_the_deploy_naming_image_and_registry():
    fake = FakePulls(PullStalled("no byte for 5 s"))
    fake.release.set()
    pulls = ImagePulls(fake, stall_seconds=5, report_seconds=0.05)
    with pytest.raises(StackFailed) as failed:
        await pulls.fetch([IMAGE], lambda _text: None)
    assert str(failed.value) == stalled_message(IMAGE, 5)
    assert "'registry.example:5000'" in str(failed.value) and "GPUHOST_PULL_STALL_SECONDS" in str(failed.value)
    assert "'docker.io'" in stalled_message("busybox:1", 5)


async def test_another_failure_is_returned_with_the_engines_message():
    """Compose pulls nothing on one machine (every image is judged as the agent
    pulled it): the deployer says the failure, with the service it was for."""
    fake = FakePulls(PullError("manifest unknown"))
    fake.release.set()
    pulls = ImagePulls(fake, stall_seconds=5, report_seconds=0.05)
    assert await pulls.fetch([IMAGE], lambda _text: None) == {IMAGE: "manifest unknown"}


# ---- d: the size before the pull ---------------------------------------------------------


def test_the_size_is_the_sum_of_the_layers_for_linux_amd64():
    manifest = {"layers": [{"size": 100}, {"size": 23}]}
    plain = {"Descriptor": {"platform": {"os": "linux", "architecture": "amd64"}}, "SchemaV2Manifest": manifest}
    assert manifest_size(json.dumps(plain)) == 123
    arm = {
        "Descriptor": {"platform": {"os": "linux", "architecture": "arm64"}},
        "OCIManifest": {"layers": [{"size": 1}]},
    }
    oci = {
        "Descriptor": {"platform": {"os": "linux", "architecture": "amd64"}},
        "OCIManifest": {"layers": [{"size": 7}]},
    }
    assert manifest_size(json.dumps([arm, oci])) == 7
    assert manifest_size(json.dumps([arm])) is None
    assert manifest_size("not json") is None
    assert manifest_size(json.dumps({"SchemaV2Manifest": {"layers": [{"size": "big"}]}})) is None


def test_only_a_registry_the_engine_calls_insecure_is_asked_without_tls():
    config = {"InsecureRegistryCIDRs": ["127.0.0.0/8"], "IndexConfigs": {"mirror.lan:5000": {"Secure": False}}}
    assert insecure_registry("127.0.0.1:5000", config)
    assert insecure_registry("mirror.lan:5000", config)
    assert not insecure_registry("registry.example:5000", config)
    assert not insecure_registry("10.0.0.1", config)
    assert not insecure_registry("[::1]:5000", config)


def test_a_refusal_names_the_image_the_size_and_the_share_or_the_floor():
    sizes = {IMAGE: 6 * GB}
    share = room_problem(sizes, Room(free=500 * GB, floor=20 * GB, share=4 * GB))
    assert share is not None and IMAGE in share and "6.00 GB" in share and "share of 4.00 GB" in share
    floor = room_problem(sizes, Room(free=25 * GB, floor=20 * GB, share=100 * GB))
    assert floor is not None and "25.00 GB free" in floor and "floor of 20.00 GB" in floor
    assert room_problem(sizes, Room(free=26 * GB, floor=20 * GB, share=6 * GB)) is None
    assert room_problem(sizes, Room(free=None, floor=20 * GB, share=0)) is None
    assert room_problem({}, Room(free=0, floor=20 * GB, share=1)) is None


async def test_a_pull_that_does_not_fit_is_refused_before_it_starts():
    fake = FakePulls()
    asked: list[tuple[str, str | None]] = []

    async def sizes(image: str, registry: str | None) -> int | None:
        asked.append((image, registry))
        return 6 * GB if image == IMAGE else None

    async def room(_rental_id: str) -> Room:
        return Room(free=500 * GB, floor=20 * GB, share=4 * GB)

    pulls = ImagePulls(fake, stall_seconds=5, sizes=sizes, room=room)
    assert roomy(Room(free=None, floor=0, share=0), 1) and roomy(Room(free=900 * GB, floor=20 * GB, share=0), 2)
    assert not roomy(Room(free=900 * GB, floor=20 * GB, share=4 * GB), 1)
    assert not roomy(Room(free=300 * GB, floor=20 * GB, share=0), 2)
    with pytest.raises(StackRejected, match="share of 4.00 GB"):
        await pulls.check_room("r1", [IMAGE])
    await pulls.check_room("r1", ["unknown:1"])  # size not told: the pull goes ahead
    assert asked == [(IMAGE, "registry.example:5000"), ("unknown:1", None)] and fake.calls == []


async def test_the_registry_is_not_asked_when_no_size_could_matter():
    async def sizes(image: str, registry: str | None) -> int | None:
        raise AssertionError("asked")

    async def room(_rental_id: str) -> Room:
        return Room(free=5000 * GB, floor=20 * GB, share=0)

    await ImagePulls(FakePulls(), stall_seconds=5, sizes=sizes, room=room).check_room("r1", [IMAGE])

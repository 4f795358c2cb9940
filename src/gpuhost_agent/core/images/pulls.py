"""The stack's missing images, pulled by the agent before `compose up`, so a
renter reads the pull's progress while the stack is APPLYING (issue 34).

Compose pulls with `--progress quiet`: for the minutes a 10 GB image takes
the renter saw `APPLYING` and nothing else. Here each missing image is
pulled through the engine's API (runtime/image_pull.py, never with the
host's registry credentials) and its events folded (pull_progress.py); the
deploy's `progress` hears the text at most every `report_seconds`, and only
when it changed, so the marketplace gets a bounded trickle whatever the
image. `up` then finds the images here.

One pull per image reference at a time, whoever asks: a second deploy (of
the same rental or another) needing an image already being pulled waits on
that pull and reads its progress. The pull runs on a thread of its own, not
owned by any deploy, so a cancelled deploy stops waiting without stopping
the pull another deploy waits on (the image is then kept, as every image is
between rentals).

A pull whose registry sends no byte for `stall_seconds`
(GPUHOST_PULL_STALL_SECONDS) fails the deploy naming the image and the
registry. Any other failure of the agent's pull (an unknown tag, a refused
registry) is left to Compose, whose own pull then fails with the message
the deploy errors have always given (core/stacks/deploy_failures.py).

Before a pull the images' size is checked against the rental's share and
the disk floor (core/images/room.py), after evicting kept images the floor
needs room from (core/images/cache.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.images.cache import ImageCache
from gpuhost_agent.core.images.pull_progress import PullProgress, progress_message
from gpuhost_agent.core.images.room import Room, room_problem, roomy
from gpuhost_agent.core.sandbox.host_network import registry_of
from gpuhost_agent.core.stacks.backend import StackFailed
from gpuhost_agent.core.stacks.compose_rewrite import StackRejected
from gpuhost_agent.runtime.image_pull import PullError, PullStalled

log = get_logger(__name__)

# reference, on_event, progress_mark, stall_seconds: blocks until pulled (runtime/image_pull.py, pull_image)
PullFn = Callable[[str, Callable[[dict], object], Callable[[], object], float], None]
NO_CONTACT_POLICIES = (None, "missing", "if_not_present")  # the policies under which Compose pulls only what is missing
SETTING = "GPUHOST_PULL_STALL_SECONDS"


@dataclass
class Flight:
    """One pull in progress: its fold (written by the pull's thread, read by
    the deploys waiting on it) and its outcome."""

    progress: PullProgress
    done: asyncio.Future[None]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, event: dict) -> None:
        with self.lock:
            self.progress.add(event)

    def mark(self) -> object:
        with self.lock:
            return self.progress.mark()

    def snapshot(self) -> PullProgress:
        with self.lock:  # a copy the loop may read while the thread folds on
            return PullProgress(self.progress.image, {k: replace(v) for k, v in self.progress.layers.items()})


def pullable_images(model: dict) -> list[str]:
    """The images of the stack Compose would pull only when missing: the
    ones the agent may pull first."""
    images = {
        str(service["image"])
        for service in (model.get("services") or {}).values()
        if isinstance(service, dict)
        and isinstance(service.get("image"), str)
        and service.get("pull_policy") in NO_CONTACT_POLICIES
    }
    return sorted(images)


def registry_name(image: str) -> str:
    return registry_of(image) or "docker.io"


def stalled_message(image: str, stall_seconds: float) -> str:
    return (
        f"deploy failed: pulling image {image!r} from registry {registry_name(image)!r} stalled: no byte came for "
        f"{stall_seconds:g} s (the host's {SETTING}); deploy again to retry"
    )


Sizer = Callable[[str, str | None], Awaitable[int | None]]  # reference, registry -> compressed size or None
Roomer = Callable[[str], Awaitable[Room]]  # rental id -> its room on Docker's disk now


class ImagePulls:
    def __init__(
        self,
        pull: PullFn,
        *,
        stall_seconds: float,
        report_seconds: float = 2.0,
        sizes: Sizer | None = None,
        room: Roomer | None = None,
        cache: ImageCache | None = None,
    ):
        """`sizes` and `room` check that the images fit before they are
        pulled (core/images/room.py); `cache` records what was pulled and
        evicts the least recently used when the floor needs room
        (core/images/cache.py)."""
        self.pull, self.stall_seconds, self.report_seconds = pull, stall_seconds, report_seconds
        self.sizes, self.room, self.cache = sizes, room, cache
        self._flights: dict[str, Flight] = {}
        self.started = 0  # pulls begun since the agent started (the tests count them)

    def _flight(self, image: str) -> Flight:
        """The pull of `image` in progress, begun now if none is."""
        flight = self._flights.get(image)
        if flight is not None:
            return flight
        loop = asyncio.get_running_loop()
        flight = Flight(PullProgress(image), loop.create_future())
        self._flights[image] = flight
        self.started += 1
        log.info("image_pull_started", image=image)

        def settle(error: BaseException | None) -> None:
            self._flights.pop(image, None)
            if error is None:
                flight.done.set_result(None)
            else:
                flight.done.set_exception(error)
                flight.done.exception()  # retrieved: a pull no deploy waits on any more is only logged
            log.info("image_pulled" if error is None else "image_pull_failed", image=image, error=str(error or ""))

        def run() -> None:
            try:
                self.pull(image, flight.add, flight.mark, self.stall_seconds)
                error: BaseException | None = None
            except (PullError, PullStalled) as exc:
                error = exc
            except Exception as exc:  # noqa: BLE001 - the loop must hear of any end
                error = PullError(str(exc))
            try:
                loop.call_soon_threadsafe(settle, error)
            except RuntimeError:  # the loop is gone: the agent stopped
                pass

        threading.Thread(target=run, daemon=True, name=f"pull-{image[:40]}").start()
        return flight

    async def check_room(self, rental_id: str, images: list[str]) -> None:
        """StackRejected when the images to pull (none already being pulled)
        do not fit the rental's share or the disk above the floor."""
        new = [image for image in images if image not in self._flights]
        if not new or self.sizes is None or self.room is None:
            return
        if roomy(await self.room(rental_id), len(new)):
            return  # no size these could have matters: the registry is not asked
        found = await asyncio.gather(*(self.sizes(image, registry_of(image)) for image in new))
        sizes = {image: size for image, size in zip(new, found, strict=True) if size}
        if sizes and self.cache is not None:
            await self.cache.make_room(sum(sizes.values()))
        problem = room_problem(sizes, await self.room(rental_id)) if sizes else None
        if problem:
            log.info("image_pull_refused", images=sorted(sizes), reason=problem)
            raise StackRejected(problem)

    async def make_room(self) -> None:
        """Before a deploy's floor check: evict what the floor needs, if anything."""
        if self.cache is not None:
            await self.cache.make_room()

    async def used(self, images: list[str]) -> None:
        """A deploy is about to start these (kept ones become the most recently used)."""
        if self.cache is not None:
            await self.cache.used(images)

    async def fetch(self, images: list[str], progress: Callable[[str], None]) -> None:
        """Pull each of `images` (those missing here), or wait on its pull in
        progress; `progress` hears the text every `report_seconds` when it
        changed. StackFailed when one stalled; other failures are left to Compose."""
        if not images:
            return
        flights = [self._flight(image) for image in images]
        waiting = {flight.done for flight in flights}
        said = ""
        while True:
            text = progress_message([flight.snapshot() for flight in flights])
            if text != said:
                progress(text)
                said = text
            if not waiting:
                break
            _done, waiting = await asyncio.wait(waiting, timeout=self.report_seconds)
        pulled = [flight.progress.image for flight in flights if flight.done.exception() is None]
        if self.cache is not None:
            await self.cache.pulled(pulled)
        for flight in flights:
            error = flight.done.exception()
            if isinstance(error, PullStalled):
                raise StackFailed(stalled_message(flight.progress.image, self.stall_seconds))
            if error is not None:
                log.warning("image_pull_left_to_compose", image=flight.progress.image, error=str(error))

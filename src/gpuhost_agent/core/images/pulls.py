"""The stack's missing images, pulled by the agent before `compose up`, so a
renter reads the pull's progress while the stack is APPLYING.

Compose pulls with `--progress quiet`: for the minutes a 10 GB image takes
the renter saw `APPLYING` and nothing else. Here each missing image is
pulled through the engine's API (runtime/image_pull.py, never with the
host's registry credentials) and its events folded (pull_progress.py); the
deploy's `progress` hears the text at most every `report_seconds`, and only
when it changed, so the marketplace gets a bounded trickle whatever the
image. `up` then finds the images here.

One pull per image reference at a time, whoever asks: a second deploy (of
the same rental or another) needing an image already being pulled waits on
that pull and reads its progress. The pull runs on a thread of its own, so a
cancelled deploy stops waiting without stopping the pull another deploy
waits on (the image is then kept, as every image is between rentals); a
pull no deploy waits on any more is cancelled (its engine request closed at
its next event, or by the stall bound: dockerd then stops it), so it holds
none of dockerd's download slots for nobody. How many
pulls run at once (per host, per rental) and for how long is pull_slots.py.

A pull whose registry sends no byte for `stall_seconds`
(GPUHOST_PULL_STALL_SECONDS), or that outlasts its deadline
(GPUHOST_PULL_MAX_SECONDS, or the minimum rate over its known size), fails
the deploy naming the image and the registry. Any other failure of the
agent's pull (an unknown tag, a refused registry) is returned to the
deployer, which says it as the deploy errors always have, naming the service
(core/stacks/deploy_failures.py): on one machine Compose pulls nothing, so
what starts is what the agent judged (core/stacks/image_checks.py); images
with `pull_policy: always` (or daily, weekly) are pulled at each deploy.

Before a pull the images' size is checked against the rental's share and
the disk floor (core/images/disk_fit.py), after evicting kept images the floor
needs room from (core/images/cache.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.compose_values import ComposeModel
from gpuhost_agent.core.images.cache import ImageCache
from gpuhost_agent.core.images.disk_fit import Room, room_problem, roomy
from gpuhost_agent.core.images.pull_progress import PullProgress, progress_message
from gpuhost_agent.core.images.pull_slots import PER_HOST, PER_RENTAL, deadline_seconds, startable
from gpuhost_agent.core.sandbox.host_network import registry_of
from gpuhost_agent.core.stack_errors import StackFailed, StackRejected
from gpuhost_agent.errors import Stopped
from gpuhost_agent.runtime.engine.records import PullEvent
from gpuhost_agent.runtime.image_pull import PullError, PullStalled

log = get_logger(__name__)

# reference, on_event, progress_mark, stall_seconds: blocks until pulled (runtime/image_pull.py, pull_image)
PullFn = Callable[[str, Callable[[PullEvent], object], Callable[[], object], float], None]
NO_CONTACT_POLICIES = (None, "missing", "if_not_present")  # the policies under which Compose pulls only what is missing
FRESH_POLICIES = ("always", "daily", "weekly")  # pulled by the agent at each deploy (a day or a week: at each one too)
SETTING = "GPUHOST_PULL_STALL_SECONDS"
MAX_SETTING = "GPUHOST_PULL_MAX_SECONDS"


class PullCancelled(Stopped, RuntimeError):
    """No deploy waits on the pull any more."""


class PullTimedOut(Stopped, RuntimeError):
    """The pull outlasted its deadline."""


@dataclass
class Flight:
    """One pull in progress: its fold (written by the pull's thread, read by
    the deploys waiting on it) and its outcome."""

    progress: PullProgress
    done: asyncio.Future[None]
    rental: str = ""  # the rental whose deploy asked first: its slots the pull takes
    waiters: int = 0  # deploys waiting on it now
    running: bool = False  # its thread started (and not yet ended)
    cancelled: bool = False
    deadline: float | None = None  # time.monotonic() past which the pull ends
    deadline_s: float = 0.0  # the deadline, in seconds from the start
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, event: PullEvent) -> None:
        """Fold one event in; raised into the pull (which then closes its
        engine request) once cancelled or past its deadline."""
        with self.lock:
            if self.cancelled:
                raise PullCancelled("no deploy waits on the pull any more")
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise PullTimedOut("the pull outlasted its deadline")
            self.progress.add(event)

    def mark(self) -> object:
        with self.lock:
            return self.progress.mark()

    def snapshot(self) -> PullProgress:
        with self.lock:  # a copy the loop may read while the thread folds on
            layers = {k: replace(v) for k, v in self.progress.layers.items()}
            return PullProgress(self.progress.image, layers, waiting=not self.running and not self.done.done())


def pullable_images(model: ComposeModel, policies: tuple = NO_CONTACT_POLICIES) -> list[str]:
    """The images of the stack whose `pull_policy` is one of `policies`: by
    default those Compose would pull only when missing, which the agent pulls
    when missing; with FRESH_POLICIES, those it pulls at every deploy."""
    images = {
        str(service["image"])
        for service in (model.get("services") or {}).values()
        if isinstance(service, dict)
        and isinstance(service.get("image"), str)
        and service.get("pull_policy") in policies
    }
    return sorted(images)


def registry_name(image: str) -> str:
    return registry_of(image) or "docker.io"


def stalled_message(image: str, stall_seconds: float) -> str:
    return (
        f"deploy failed: pulling image {image!r} from registry {registry_name(image)!r} stalled: no byte came for "
        f"{stall_seconds:g} s (the host's {SETTING}); deploy again to retry"
    )


def timed_out_message(image: str, seconds: float) -> str:
    return (
        f"deploy failed: pulling image {image!r} from registry {registry_name(image)!r} took longer than "
        f"{seconds:g} s (at most the host's {MAX_SETTING}); deploy again to retry"
    )


Sizer = Callable[[str, str | None], Awaitable[int | None]]  # reference, registry -> compressed size or None
Roomer = Callable[[str], Awaitable[Room]]  # rental id -> its room on Docker's disk now


class ImagePulls:
    pulls_locally = True  # a stack's images are pulled by, and kept on, this machine's engine

    def __init__(
        self,
        pull: PullFn,
        *,
        stall_seconds: float,
        max_seconds: float = 3 * 3600.0,
        report_seconds: float = 2.0,
        per_host: int = PER_HOST,
        per_rental: int = PER_RENTAL,
        sizes: Sizer | None = None,
        room: Roomer | None = None,
        cache: ImageCache | None = None,
    ):
        """`sizes` and `room` check that the images fit before they are
        pulled (core/images/disk_fit.py); `cache` records what was pulled and
        evicts the least recently used when the floor needs room
        (core/images/cache.py)."""
        self.pull, self.stall_seconds, self.report_seconds = pull, stall_seconds, report_seconds
        self.max_seconds, self.per_host, self.per_rental = max_seconds, per_host, per_rental
        self.sizes, self.room, self.cache = sizes, room, cache
        self._flights: dict[str, Flight] = {}  # the pulls deploys wait on, queued or running
        self._queue: list[Flight] = []  # in the order asked
        self._running: list[Flight] = []  # threads not yet ended, cancelled ones included: they hold slots
        self._sizes: dict[str, int] = {}  # manifest sizes check_room found, for the pulls about to start
        self.started = 0  # pulls begun since the agent started (the tests count them)

    def _flight(self, image: str, rental: str) -> Flight:
        """The pull of `image` in progress or queued, queued now if none is."""
        flight = self._flights.get(image)
        if flight is None:
            flight = Flight(PullProgress(image), asyncio.get_running_loop().create_future(), rental=rental)
            self._flights[image] = flight
            self._queue.append(flight)
            self._start_queued()
        return flight

    def _start_queued(self) -> None:
        running: dict[str, int] = {}
        for flight in self._running:
            running[flight.rental] = running.get(flight.rental, 0) + 1
        queued = [(flight.progress.image, flight.rental) for flight in self._queue]
        chosen = set(startable(queued, running, per_host=self.per_host, per_rental=self.per_rental))
        for flight in [flight for flight in self._queue if flight.progress.image in chosen]:
            self._queue.remove(flight)
            self._start(flight)

    def _release(self, flight: Flight) -> None:
        """A deploy stopped waiting on `flight`: the last one cancels it."""
        flight.waiters -= 1
        if flight.waiters > 0 or flight.done.done():
            return
        image = flight.progress.image
        if self._flights.get(image) is flight:
            del self._flights[image]
        with flight.lock:
            flight.cancelled = True
        if flight in self._queue:
            self._queue.remove(flight)
            flight.done.set_exception(PullCancelled("no deploy waits on the pull any more"))
            flight.done.exception()
        log.info("image_pull_cancelled", image=image, started=flight.running)

    def _start(self, flight: Flight) -> None:
        image, loop = flight.progress.image, asyncio.get_running_loop()
        flight.running, flight.deadline_s = True, deadline_seconds(self._sizes.pop(image, None), self.max_seconds)
        flight.deadline = time.monotonic() + flight.deadline_s
        self._running.append(flight)
        self.started += 1
        log.info("image_pull_started", image=image, rental_id=flight.rental, deadline_s=round(flight.deadline_s))

        def settle(error: BaseException | None) -> None:
            if self._flights.get(image) is flight:
                del self._flights[image]
            flight.running = False
            self._running.remove(flight)
            self._start_queued()
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
            except (PullError, PullStalled, PullCancelled, PullTimedOut) as exc:
                error = exc
            except Exception as exc:  # noqa: BLE001 - the loop must hear of any end
                error = PullError(str(exc))
            try:
                loop.call_soon_threadsafe(settle, error)
            except RuntimeError:  # the loop is gone: the agent stopped
                pass

        threading.Thread(target=run, daemon=True, name=f"pull-{image[:40]}").start()

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
        self._sizes = {**self._sizes, **sizes} if len(self._sizes) < 1000 else dict(sizes)  # bounded
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

    async def fetch(self, images: list[str], progress: Callable[[str], None], rental_id: str = "") -> dict[str, str]:
        """Pull each of `images` (those missing here), or wait on its pull in
        progress; `progress` hears the text every `report_seconds` when it
        changed. StackFailed when one stalled or timed out; the other failed
        pulls are returned, image -> the engine's message (the deployer says
        them: Compose pulls nothing on one machine). A pull this deploy alone
        waited on is cancelled when the deploy is."""
        if not images:
            return {}
        flights = []
        for image in images:
            flights.append(self._flight(image, rental_id))
            flights[-1].waiters += 1
        try:
            return await self._wait(flights, progress)
        finally:
            for flight in flights:
                self._release(flight)

    async def _wait(self, flights: list[Flight], progress: Callable[[str], None]) -> dict[str, str]:
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
        failed = {}
        for flight in flights:
            error = flight.done.exception()
            if isinstance(error, PullStalled):
                raise StackFailed(stalled_message(flight.progress.image, self.stall_seconds))
            if isinstance(error, PullTimedOut):
                raise StackFailed(timed_out_message(flight.progress.image, flight.deadline_s))
            if error is not None:
                log.warning("image_pull_failed", image=flight.progress.image, error=str(error))
                failed[flight.progress.image] = str(error)
        return failed

"""Stand-ins for the agent's own classes, one of each, typed against the real ones.

Each fake names the real class it stands in for (`stands_in_for`) and has the
real methods' signatures; whatever else it has for the test's side (what it
recorded, knobs) is listed in `test_side`. tests/unit/test_fakes.py checks
every fake's public methods against the real class with inspect.signature, so
a method renamed or re-shaped in the agent breaks that test, not a distant one
that happens to use the fake.

Keep them dumb: a fake records what it was given and answers what the test
set. Behaviour worth testing belongs to the real classes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Awaitable, Callable, ClassVar

from gpuhost_agent.core.schedule import Schedule
from gpuhost_agent.streams.sink import Sink
from gpuhost_agent.uplink.outbox import Outbox
from support.renter_streams import Demux


# ---- the uplink ------------------------------------------------------------------------

class FakeOutbox:
    """Stands in for Outbox: keeps every report put, in order, and never sends."""

    stands_in_for: ClassVar[type] = Outbox
    test_side: ClassVar[tuple[str, ...]] = ()

    dropped = 0

    def __init__(self) -> None:
        self.reports: list[tuple[str, str, dict]] = []

    def put(self, kind: str, target: str, body: dict) -> None:
        self.reports.append((kind, target, body))

    def pending(self) -> int:
        return len(self.reports)


# ---- the agent's parts -----------------------------------------------------------------

class FakeSchedule:
    """Stands in for Schedule: periodic work is never run."""

    stands_in_for: ClassVar[type] = Schedule
    test_side: ClassVar[tuple[str, ...]] = ()

    def every(self, name: str, seconds: float, work: Callable[[], Awaitable[None]], *, now: bool = False) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


# ---- streams -----------------------------------------------------------------------------

class MemorySink:
    """Stands in for a stream's WebSocket (streams.sink.Sink), in memory.

    Its speed is the test's to control: `gate` cleared stalls it (as a reader
    that stopped reading), `delay` slows every message. What it received is read
    back with support.renter_streams.Demux, not with the agent's parser."""

    stands_in_for: ClassVar[type] = Sink
    test_side: ClassVar[tuple[str, ...]] = ("peer_closes", "type", "lines", "until", "output")

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.gate = asyncio.Event()
        self.gate.set()
        self.demux = Demux()
        self.binary = bytearray()
        self.messages = 0
        self.texts: list[dict] = []
        self.closed = asyncio.Event()
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.changed = asyncio.Event()

    async def send_bytes(self, data: bytes) -> None:
        await self.gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        assert not self.closed.is_set(), "sent after close"
        self.messages += 1
        self.binary += data
        self.demux.feed(data)
        self.changed.set()

    async def send_json(self, message: dict) -> None:
        assert not self.closed.is_set(), "sent after close"
        self.texts.append(json.loads(json.dumps(message)))
        self.changed.set()

    async def receive(self) -> bytes | str | None:
        return await self.inbox.get()

    async def close(self) -> None:
        self.closed.set()
        self.inbox.put_nowait(None)
        self.changed.set()

    # ---- the test's side ---------------------------------------------------------
    def peer_closes(self) -> None:
        self.inbox.put_nowait(None)

    def type(self, data: bytes | str) -> None:
        self.inbox.put_nowait(data)

    def lines(self, stream: int) -> list[str]:
        return self.demux.lines(stream)

    async def until(self, predicate, timeout: float = 10) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            remaining = deadline - loop.time()
            assert remaining > 0, f"sink: condition not reached; texts {self.texts}, tail {bytes(self.binary[-300:])!r}"
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)

    def output(self) -> str:
        return self.binary.decode(errors="replace")


# Every fake above, for tests/unit/test_fakes.py.
FAKES: tuple[type, ...] = (FakeOutbox, FakeSchedule, MemorySink)

"""An in-memory stand-in for a stream's WebSocket, and containers to stream from.

The sink's speed is the test's to control: `gate` cleared stalls it (as a
reader that stopped reading), `delay` slows every message. What it received
is read back with tests/renter_streams.Demux, not with the agent's parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid

from gpuhost_agent.protocol import wire
from conftest import TEST_IMAGE
from renter_streams import Demux


class MemorySink:
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

    async def receive(self):
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


def labels(env_id: str, rental_id: str, stack_id: str) -> dict:
    return {wire.LABEL_MANAGED: "true", wire.LABEL_ENV: env_id, wire.LABEL_RENTAL: rental_id,
            wire.LABEL_STACK: stack_id}


class Containers:
    """Containers with the agent's labels, removed at the end of the test."""

    def __init__(self, docker_client):
        self.client = docker_client
        self.env_id = "env-" + uuid.uuid4().hex[:8]
        self.rental_id = "rental-" + uuid.uuid4().hex[:8]
        self.stack_id = "stack-" + uuid.uuid4().hex[:8]
        self.made: list = []

    def run(self, script: str, *, tty: bool = False, stack_id: str | None = None, **kwargs):
        container = self.client.containers.run(
            TEST_IMAGE, ["sh", "-c", script], detach=True, tty=tty,
            labels=labels(self.env_id, self.rental_id, stack_id or self.stack_id), **kwargs)
        self.made.append(container)
        return container

    def remove_all(self) -> None:
        for container in self.made:
            with contextlib.suppress(Exception):
                container.remove(force=True)

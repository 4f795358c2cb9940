"""Pulls per host and per rental, queued in order and
said so; a pull no deploy waits on is cancelled; a drip-feeding registry
meets the pull's deadline (core/images/pull_slots.py, core/images/pulls.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gpuhost_agent.core.images.pull_slots import GRACE_SECONDS, deadline_seconds, startable
from gpuhost_agent.core.images.pulls import ImagePulls, timed_out_message
from gpuhost_agent.core.stack_errors import StackFailed


def test_slots_go_in_order_within_the_host_and_rental_caps():
    queued = [("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("c1", "C")]
    assert startable(queued, {}) == ["a1", "a2", "b1"]
    assert startable(queued, {"A": 1}) == ["a1", "b1"]
    assert startable(queued, {"B": 1, "C": 1, "A": 1}) == []
    assert startable(queued, {"A": 2}, per_host=4) == ["b1", "c1"]


def test_the_deadline_is_a_minimum_rate_over_the_known_size_never_over_the_cap():
    assert deadline_seconds(None, 600) == 600
    assert deadline_seconds(10_000_000, 600) == GRACE_SECONDS + 10
    assert deadline_seconds(10**12, 600) == 600


class Drip:
    """A registry that sends a byte now and then until the test (or the
    agent, by raising from on_event) stops it."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.running: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, reference, on_event, _mark, _stall) -> None:
        with self.lock:
            self.running.add(reference)
        try:
            current = 0
            while not self.stop.is_set():
                current += 1
                on_event({"status": "Downloading", "id": "l1", "progressDetail": {"current": current, "total": 10**9}})
                time.sleep(0.02)
        finally:
            with self.lock:
                self.running.discard(reference)


async def until(condition, seconds: float = 3.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.02)


async def test_one_rental_takes_two_slots_and_the_rest_wait_saying_so():
    drip = Drip()
    pulls = ImagePulls(drip, stall_seconds=5, report_seconds=0.05)
    heard: list[str] = []
    try:
        a = asyncio.create_task(pulls.fetch(["a:1", "a:2", "a:3"], heard.append, "A"))
        b = asyncio.create_task(pulls.fetch(["b:1"], lambda _t: None, "B"))
        await until(lambda: drip.running == {"a:1", "a:2", "b:1"})
        await until(lambda: any("image 'a:3': waiting for a pull slot" in text for text in heard))
        c = asyncio.create_task(pulls.fetch(["c:1"], lambda _t: None, "C"))
        await asyncio.sleep(0.2)
        assert "c:1" not in drip.running  # the host's three slots are taken
        b.cancel()  # B's deploy ends: its pull is cancelled, its slot goes to the next in order
        await until(lambda: drip.running == {"a:1", "a:2", "c:1"})
        a.cancel()
        c.cancel()
        await until(lambda: not drip.running)
        assert pulls.started == 4 and not pulls._flights  # noqa: SLF001 - a:3 never started
    finally:
        drip.stop.set()


async def test_a_drip_fed_pull_meets_its_deadline_and_fails_the_deploy():
    drip = Drip()
    pulls = ImagePulls(drip, stall_seconds=5, max_seconds=0.3, report_seconds=0.05)
    try:
        with pytest.raises(StackFailed) as failed:
            await asyncio.wait_for(pulls.fetch(["evil.example/drip:1"], lambda _t: None, "A"), 5)
        assert str(failed.value) == timed_out_message("evil.example/drip:1", 0.3)
        assert "GPUHOST_PULL_MAX_SECONDS" in str(failed.value) and "'evil.example'" in str(failed.value)
        await until(lambda: not drip.running)
    finally:
        drip.stop.set()

"""Execs started per rental (streams/exec_rate.py) and the exit-code poll
(runtime/engine_streams.py): what a loop of sessions costs the host's engine."""

from __future__ import annotations

import asyncio

from gpuhost_agent.runtime import engine_streams
from gpuhost_agent.streams.exec_rate import ExecRate


def test_a_rental_gets_its_burst_then_its_rate_and_another_rental_its_own() -> None:
    now = [0.0]
    rate = ExecRate(burst=3, per_second=2.0, clock=lambda: now[0])
    assert [rate.take("a") for _ in range(3)] == [None, None, None]
    refused = rate.take("a")
    assert refused and "at most 3 at once and 2 a second" in refused
    assert rate.take("b") is None  # another rental is not starved by the first
    now[0] += 0.5  # one token back
    assert rate.take("a") is None and rate.take("a") is not None
    assert rate.refused == 2


def test_full_buckets_are_dropped_past_the_bound(monkeypatch) -> None:
    from gpuhost_agent.streams import exec_rate

    monkeypatch.setattr(exec_rate, "KEPT", 100)
    now = [0.0]
    rate = ExecRate(burst=2, per_second=1.0, clock=lambda: now[0])
    for n in range(150):
        rate.take(f"r{n}")
        now[0] += 0.01
    assert len(rate._buckets) <= 101  # a rental seen once is not kept for ever


async def test_an_exec_that_runs_on_after_its_output_is_inspected_a_few_times_not_every_50_ms() -> None:
    class StillRunning(engine_streams.EngineStreams):
        def __init__(self) -> None:
            self.inspections = 0

        async def exec_inspect(self, exec_id: str) -> dict:
            self.inspections += 1
            return {"Running": True, "ExitCode": 0}

    engine = StillRunning()
    started = asyncio.get_running_loop().time()
    assert await engine.exec_exit_code("e" * 64, 2.0) is None
    assert asyncio.get_running_loop().time() - started < 3.0
    assert engine.inspections <= 8, engine.inspections  # every 50 ms, 2 s took 40

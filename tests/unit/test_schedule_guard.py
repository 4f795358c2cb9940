"""Every job scheduled through Schedule runs inside one guard: a failing run is
logged once as periodic_work_failed and the job keeps its schedule; a
cancellation (shutdown) still propagates."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from support.waiting import until

from gpuhost_agent.common import logs
from gpuhost_agent.core.schedule import Schedule, guarded


@pytest.fixture
def log_stream():
    stream = io.StringIO()
    logs.configure("info", json_lines=True, stream=stream)
    try:
        yield stream
    finally:
        logs.configure("warning", json_lines=True)


def _lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


async def test_a_failing_run_is_logged_once_and_the_job_runs_again(log_stream):
    runs = 0

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("first run fails")

    schedule = Schedule()
    schedule.every("flaky", 0.05, flaky, now=True)
    schedule.start()
    try:
        await until(lambda: runs >= 3, 5)
    finally:
        schedule.stop()

    lines = _lines(log_stream)
    failures = [line for line in lines if line["event"] == "periodic_work_failed"]
    assert len(failures) == 1, lines
    assert failures[0]["name"] == "flaky" and failures[0]["level"] == "error"
    assert "RuntimeError: first run fails" in failures[0]["exception"]
    assert not [line for line in lines if line.get("logger", "").startswith("apscheduler")], (
        "APScheduler never sees the exception, so it logs nothing of its own"
    )


async def test_a_cancellation_propagates_and_is_not_a_failure(log_stream):
    started = asyncio.Event()

    async def long_work() -> None:
        started.set()
        await asyncio.sleep(60)

    task = asyncio.create_task(guarded("long", long_work)())
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not [line for line in _lines(log_stream) if line["event"] == "periodic_work_failed"]

"""The daemon's event loop is uvloop's where uvloop is installed (a
dependency on Linux), asyncio's own where it is not; and the tests run on
the loop the daemon runs (tests/conftest.py), so an agent built in a test
meets the same loop as `gpuhost-agent run`."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from gpuhost_agent.service import daemon


def _loop_of_a_run() -> type:
    seen: list[type] = []

    async def probe() -> None:
        seen.append(type(asyncio.get_running_loop()))

    daemon.run_event_loop(probe())
    return seen[0]


def test_the_daemon_runs_on_uvloop() -> None:
    assert _loop_of_a_run() is uvloop.Loop


def test_without_uvloop_the_daemon_runs_on_asyncios_own_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as on a host where it is not installed
    loop = _loop_of_a_run()
    assert issubclass(loop, asyncio.AbstractEventLoop) and loop is not uvloop.Loop


async def test_the_tests_run_on_the_daemons_loop() -> None:
    assert type(asyncio.get_running_loop()) is uvloop.Loop

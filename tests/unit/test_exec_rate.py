"""Execs started per rental (streams/exec_rate.py) and the exit-code poll
(runtime/engine/streams.py): what a loop of sessions costs the host's engine."""

from __future__ import annotations

import asyncio

from gpuhost_agent.runtime.engine import streams as engine_streams
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


async def test_a_loop_of_sftp_opens_and_of_sessions_pays_the_rentals_bucket_before_any_engine_call() -> None:
    """Each SFTP open started the root file helper with no token taken,
    and a refused session still asked the engine to inspect the container. The engine here
    counts what it is asked (its stand-in is the lowest layer: the calls themselves)."""
    from types import SimpleNamespace

    from gpuhost_agent.runtime.engine.streams import ContainerAt
    from gpuhost_agent.streams.ssh import connection as ssh_connection
    from gpuhost_agent.streams.ssh.connection import SshConnection

    class Engine:
        locates = helpers = 0

        async def locate(self, container_id: str) -> ContainerAt:
            self.locates += 1
            return ContainerAt({"Id": container_id, "State": {"Pid": 1, "Running": True}, "Config": {}})

        async def open_files(self, container: ContainerAt) -> object:
            self.helpers += 1
            return SimpleNamespace()

    class Login:
        container = {"Id": "a" * 64}

        async def looked_up(self) -> None:
            return None

    said: list[bytes] = []
    process = SimpleNamespace(
        command="true", stderr=SimpleNamespace(write=said.append), get_terminal_type=lambda: None, exit=lambda _: None
    )
    engine, rate = Engine(), ExecRate(burst=4, per_second=0.001)
    connection = SshConnection.__new__(SshConnection)
    connection._services = SimpleNamespace(engine=engine, execs=rate)  # type: ignore[assignment]
    connection._request = SimpleNamespace(stream_id="s", rental_id="r1")  # type: ignore[assignment]
    connection._login = Login()  # type: ignore[assignment]
    refusals = 0
    for _ in range(20):
        try:
            await connection._sftp(None)  # type: ignore[arg-type]
        except ValueError as exc:
            refusals += "too many sessions started" in str(exc)
    assert (engine.helpers, refusals) == (4, 16)
    started: list[str] = []

    class Session:
        def __init__(self, _engine: object, container_id: str) -> None:
            started.append(container_id)

        async def run(self, _process: object) -> None:
            return None

    original, ssh_connection.ExecSession = ssh_connection.ExecSession, Session  # type: ignore[misc]
    try:
        engine.locates = 0
        for _ in range(20):
            await connection._session(process)  # type: ignore[arg-type]
    finally:
        ssh_connection.ExecSession = original  # type: ignore[misc]
    assert (started, engine.locates) == ([], 0)  # the bucket is empty: no exec, and not one inspect
    assert len([line for line in said if b"too many sessions started" in line]) == 20

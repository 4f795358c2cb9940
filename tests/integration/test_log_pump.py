"""One log stream against the real Docker Engine, into a sink whose speed the test sets.

What arrives is read with tests/renter_streams.Demux and compared with what
the containers printed (numbered lines) or with docker-py's own reading.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from support.engine import Containers
from support.fakes import MemorySink
from support.renter_streams import STDERR, STDOUT, SYSTEM

from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.streams.log_pump import LogPump
from gpuhost_agent.streams.requests import LogsRequest

NUMBERED = "i=1; while [ $i -le 500 ]; do echo out-$i; echo err-$i >&2; i=$((i+1)); done"


@pytest.fixture
async def boxes(docker_client):
    made = Containers(docker_client)
    engine = EngineStreams()
    try:
        yield made, engine
    finally:
        await engine.close()
        await asyncio.to_thread(made.remove_all)


def request(made: Containers, container, **options) -> LogsRequest:
    return LogsRequest("s1", made.rental_id, made.stack_id, container.id, **options)


async def finished(container, timeout: float = 30):
    await asyncio.to_thread(container.wait, timeout=timeout)
    return container


async def test_exact_lines_streams_apart_timestamps_off(boxes):
    made, engine = boxes
    box = await finished(await asyncio.to_thread(made.run, NUMBERED))
    sink = MemorySink()
    assert await LogPump(engine, request(made, box), sink).run() == "done"
    assert sink.lines(STDOUT) == [f"out-{i}" for i in range(1, 501)]
    assert sink.lines(STDERR) == [f"err-{i}" for i in range(1, 501)]
    assert sink.lines(SYSTEM) == [] and sink.demux.leftover == 0
    assert sink.texts == [{"type": "end", "reason": "done"}] and sink.closed.is_set()


async def test_tail_since_and_timestamps_as_docker_gives_them(boxes, docker_client):
    made, engine = boxes
    box = await finished(await asyncio.to_thread(made.run, NUMBERED + "; sleep 2; echo late"))

    sink = MemorySink()
    await LogPump(engine, request(made, box, tail=3), sink).run()
    expected = (await asyncio.to_thread(docker_client.api.logs, box.id, tail=3)).decode().splitlines()
    assert sorted(sink.lines(STDOUT) + sink.lines(STDERR)) == sorted(expected) and len(expected) == 3

    sink = MemorySink()
    await LogPump(engine, request(made, box, tail=4, timestamps=True), sink).run()
    stamped = (
        (await asyncio.to_thread(docker_client.api.logs, box.id, tail=4, stdout=True, stderr=False, timestamps=True))
        .decode()
        .splitlines()
    )
    assert sink.lines(STDOUT) == stamped and stamped[-1].endswith("Z late")

    late = stamped[-1].split(" ", 1)[0]
    since = int(time.mktime(time.strptime(late[:19], "%Y-%m-%dT%H:%M:%S"))) - time.timezone
    sink = MemorySink()
    await LogPump(engine, request(made, box, since=since), sink).run()
    assert sink.lines(STDOUT) == ["late"] and sink.lines(STDERR) == []


async def test_tty_container_as_stdout_frames(boxes):
    made, engine = boxes
    box = await finished(
        await asyncio.to_thread(made.run, "echo first; echo second >&2; printf 'no newline'", tty=True)
    )
    sink = MemorySink()
    await LogPump(engine, request(made, box), sink).run()
    assert sink.demux.frames == [(STDOUT, b"first\r\n"), (STDOUT, b"second\r\n"), (STDOUT, b"no newline")]
    sink = MemorySink()
    await LogPump(engine, request(made, box, timestamps=True, tail=1), sink).run()
    (only,) = sink.demux.frames
    assert only[1].endswith(b"Z no newline")


async def test_follow_gets_later_lines_then_ends_on_removal(boxes, docker_client):
    made, engine = boxes
    box = await asyncio.to_thread(made.run, "echo before; sleep 3600")
    while b"before" not in await asyncio.to_thread(box.logs):  # noqa: ASYNC110 - polls the engine
        await asyncio.sleep(0.05)
    sink = MemorySink()
    pump = asyncio.create_task(LogPump(engine, request(made, box, follow=True, tail=0), sink).run())
    await asyncio.sleep(0.5)
    for i in range(3):
        await asyncio.to_thread(
            lambda i=i: docker_client.api.exec_start(
                docker_client.api.exec_create(box.id, ["sh", "-c", f"echo later-{i} > /proc/1/fd/1"])
            )
        )
    await sink.until(lambda: len(sink.lines(STDOUT)) == 3)
    assert sink.lines(STDOUT) == ["later-0", "later-1", "later-2"]
    await asyncio.to_thread(box.remove, force=True)
    assert await asyncio.wait_for(pump, 15) == "container-removed"
    assert sink.texts[-1] == {"type": "end", "reason": "container-removed"}


async def test_follow_resumes_across_docker_restarts_without_duplicates(boxes):
    """A container Docker restarts (restart policy) is followed on: the follow
    ends only when the container stops for good, as `docker logs -f` does."""
    made, engine = boxes
    box = await asyncio.to_thread(
        made.run,
        "echo line-a; echo line-b >&2; sleep 1; exit 3",
        restart_policy={"Name": "on-failure", "MaximumRetryCount": 1},
    )
    sink = MemorySink()
    pump = LogPump(engine, request(made, box, follow=True), sink, poll_seconds=0.05)
    assert await asyncio.wait_for(pump.run(), 30) == "exited"
    kinds = [(kind, payload.decode()) for kind, payload in sink.demux.frames]
    restarted = "gpuhost: container exited with code 3; following on when it starts again\n"
    stopped = "gpuhost: container exited with code 3\n"
    assert [k for k in kinds if k[0] == SYSTEM] == [(SYSTEM, restarted), (SYSTEM, stopped)]
    first_exit = kinds.index((SYSTEM, restarted))
    assert sorted(kinds[:first_exit]) == [(STDOUT, "line-a\n"), (STDERR, "line-b\n")]
    assert sorted(kinds[first_exit + 1 : -1]) == [(STDOUT, "line-a\n"), (STDERR, "line-b\n")]
    assert sink.texts == [{"type": "end", "reason": "exited", "exitCode": 3}]


async def test_follow_on_a_stopped_container_gives_its_log_and_ends(boxes):
    """`docker logs -f` on an exited container prints what it printed and
    returns; so does a follow here, with no line of the agent's own. One that
    stops while followed ends too, with a last line saying how."""
    made, engine = boxes
    box = await finished(await asyncio.to_thread(made.run, "echo early; echo late >&2; exit 2"))
    sink = MemorySink()
    assert await asyncio.wait_for(LogPump(engine, request(made, box, follow=True), sink).run(), 10) == "exited"
    assert sink.lines(STDOUT) == ["early"] and sink.lines(STDERR) == ["late"] and sink.lines(SYSTEM) == []
    assert sink.texts == [{"type": "end", "reason": "exited", "exitCode": 2}]

    box = await asyncio.to_thread(made.run, "echo running; sleep 1")
    sink = MemorySink()
    pump = LogPump(engine, request(made, box, follow=True), sink, poll_seconds=0.05)
    assert await asyncio.wait_for(pump.run(), 15) == "exited"
    assert sink.lines(STDOUT) == ["running"]
    assert sink.lines(SYSTEM) == ["gpuhost: container exited with code 0"]
    assert sink.texts == [{"type": "end", "reason": "exited", "exitCode": 0}]


async def test_stalled_reader_gets_counted_drops_and_continuous_numbers(boxes):
    made, engine = boxes
    total = 300_000
    box = await finished(await asyncio.to_thread(made.run, f"seq 1 {total}"), timeout=60)
    sink = MemorySink()
    sink.gate.clear()  # the reader stops reading
    pump = LogPump(engine, request(made, box), sink, buffer_bytes=64 * 1024, stall_seconds=0.3)
    task = asyncio.create_task(pump.run())
    await asyncio.sleep(1.0)
    sink.gate.set()
    assert await asyncio.wait_for(task, 60) == "done"

    expected, received, dropped_lines, markers = 1, 0, 0, 0
    for kind, payload in sink.demux.frames:
        if kind == SYSTEM:
            words = payload.decode().split()
            assert words[0] == "gpuhost:" and payload.decode().endswith("dropped: the reader fell behind\n"), payload
            lines, nbytes = int(words[1]), int(words[4].strip("("))
            assert nbytes == sum(len(str(n)) + 1 for n in range(expected, expected + lines))
            expected += lines
            dropped_lines += lines
            markers += 1
        else:
            assert (kind, payload) == (STDOUT, b"%d\n" % expected)
            expected += 1
            received += 1
    assert expected == total + 1 and received + dropped_lines == total
    assert markers >= 1 and dropped_lines > 0 and received >= 1000


async def test_short_stall_loses_nothing_and_peer_close_ends(boxes):
    made, engine = boxes
    box = await finished(await asyncio.to_thread(made.run, "seq 1 50000"))
    sink = MemorySink()
    sink.gate.clear()
    task = asyncio.create_task(LogPump(engine, request(made, box), sink, buffer_bytes=64 * 1024, stall_seconds=5).run())
    await asyncio.sleep(0.5)
    sink.gate.set()
    assert await asyncio.wait_for(task, 30) == "done"
    assert sink.lines(STDOUT) == [str(i) for i in range(1, 50001)]

    sink = MemorySink()  # the whole log (about 0.7 MiB) waits in the buffer, then goes out in runs
    sink.gate.clear()
    task = asyncio.create_task(LogPump(engine, request(made, box), sink).run())
    await asyncio.sleep(1.5)
    sink.gate.set()
    assert await asyncio.wait_for(task, 30) == "done"
    assert sink.lines(STDOUT) == [str(i) for i in range(1, 50001)]
    assert sink.messages < 100, "frames that waited are sent in runs, not one message each"

    follower = await asyncio.to_thread(made.run, "sleep 3600")
    sink = MemorySink()
    task = asyncio.create_task(LogPump(engine, request(made, follower, follow=True), sink).run())
    await asyncio.sleep(0.3)
    sink.peer_closes()
    assert await asyncio.wait_for(task, 5) == "closed"
    assert sink.texts == [] and sink.closed.is_set()


class StallingEngine(EngineStreams):
    """The real engine, whose first follow stops delivering after its first
    chunk while staying open: what Docker 20.10 does after a rotation with a
    reader behind (moby/moby#39235), which cannot be brought about on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled = False

    async def open_logs(self, container_id: str, **options):  # type: ignore[override]
        reader = await super().open_logs(container_id, **options)
        if options.get("follow") and not self.stalled:
            self.stalled = True
            return _Stalls(reader)
        return reader


class _Stalls:
    def __init__(self, reader) -> None:
        self._reader, self._given = reader, False

    async def read(self) -> bytes:
        if not self._given:
            self._given = True
            return await self._reader.read()
        await asyncio.Event().wait()  # open, and silent for ever
        return b""

    def close(self) -> None:
        self._reader.close()


async def test_a_follow_that_stalls_behind_the_log_is_opened_again_without_loss_or_duplicates(boxes):
    made, _ = boxes
    engine = StallingEngine()
    try:
        box = await asyncio.to_thread(
            made.run, "i=1; while [ $i -le 60 ]; do echo n-$i; i=$((i+1)); sleep 0.05; done; sleep 3600"
        )
        sink = MemorySink()
        pump = LogPump(engine, request(made, box, follow=True), sink, follow_check_seconds=0.5)
        running = asyncio.create_task(pump.run())
        await sink.until(lambda: len(sink.lines(STDOUT)) >= 60, timeout=30)
        assert sink.lines(STDOUT) == [f"n-{i}" for i in range(1, 61)]
        assert engine.stalled and pump.follow_check.restarts == 1
        pump.stop("agent-stopping")
        await asyncio.wait_for(running, 10)
    finally:
        await engine.close()

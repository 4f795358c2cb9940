"""Terminals against the real Docker Engine: an exec with a TTY, bytes both ways."""

from __future__ import annotations

import asyncio
import json

import pytest
from support.engine import Containers
from support.fakes import MemorySink

from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.streams.requests import TerminalRequest
from gpuhost_agent.streams.terminal import Terminal


@pytest.fixture
async def box(docker_client):
    made = Containers(docker_client)
    engine = EngineStreams()
    try:
        yield made, engine, await asyncio.to_thread(made.run, "sleep 3600")
    finally:
        await engine.close()
        await asyncio.to_thread(made.remove_all)


def open_terminal(made, engine, container, **options) -> tuple[Terminal, MemorySink, asyncio.Task]:
    sink = MemorySink()
    terminal = Terminal(engine, TerminalRequest("t1", made.rental_id, made.stack_id, container.id, **options), sink)
    return terminal, sink, asyncio.create_task(terminal.run())


def shells(container) -> int:
    return sum(1 for process in container.top()["Processes"] if process[-1] in ("/bin/sh", "sh"))


async def test_commands_resize_and_exit_code(box):
    made, engine, container = box
    _terminal, sink, task = open_terminal(made, engine, container, cols=100, rows=30)
    sink.type(b"stty size; echo sum-$((6*7))\n")
    await sink.until(lambda: "sum-42" in sink.output().replace("$((6*7))", ""))
    assert "30 100" in sink.output()
    sink.type(json.dumps({"type": "resize", "cols": 123, "rows": 45}))
    sink.type(json.dumps({"type": "resize", "cols": 0, "rows": 45}))  # ignored
    await asyncio.sleep(0.2)
    sink.type(b"stty size\n")
    await sink.until(lambda: "45 123" in sink.output())
    sink.type(b"exit 7\n")
    assert await asyncio.wait_for(task, 10) == "exited"
    assert sink.texts == [{"type": "end", "reason": "exited", "exitCode": 7}] and sink.closed.is_set()


async def test_command_that_ends_by_itself(box):
    made, engine, container = box
    _terminal, sink, task = open_terminal(made, engine, container, command=("sh", "-c", "echo hello; exit 0"))
    assert await asyncio.wait_for(task, 10) == "exited"
    assert "hello" in sink.output()
    assert sink.texts == [{"type": "end", "reason": "exited", "exitCode": 0}]


async def test_stop_and_peer_close_end_the_shell_too(box):
    made, engine, container = box
    terminal, sink, task = open_terminal(made, engine, container)
    sink.type(b"echo ready\n")
    await sink.until(lambda: "ready" in sink.output())
    assert await asyncio.to_thread(shells, container) == 1
    terminal.stop("rental-ended")
    assert await asyncio.wait_for(task, 10) == "rental-ended"
    assert sink.texts == [{"type": "end", "reason": "rental-ended"}]

    _terminal, sink, task = open_terminal(made, engine, container)
    sink.type(b"echo again\n")
    await sink.until(lambda: "again" in sink.output())
    sink.peer_closes()
    assert await asyncio.wait_for(task, 10) == "closed"
    assert sink.texts == []
    assert await asyncio.to_thread(shells, container) == 0, "a closed terminal leaves no shell behind"


async def test_two_terminals_at_once(box):
    made, engine, container = box
    _t1, first, task1 = open_terminal(made, engine, container)
    _t2, second, task2 = open_terminal(made, engine, container)
    first.type(b"echo one-$((2*3))\n")
    second.type(b"echo two-$((3*3))\n")
    await first.until(lambda: "one-6" in first.output())
    await second.until(lambda: "two-9" in second.output())
    assert "two-9" not in first.output() and "one-6" not in second.output()
    second.type(b"exit 2\n")
    assert await asyncio.wait_for(task2, 10) == "exited"
    first.type(b"echo still-here\n")
    await first.until(lambda: "still-here" in first.output())
    first.type(b"exit\n")
    assert await asyncio.wait_for(task1, 10) == "exited"
    assert second.texts[-1]["exitCode"] == 2 and first.texts[-1]["exitCode"] == 0


async def test_missing_command_ends_with_an_error(box):
    made, engine, container = box
    _terminal, sink, task = open_terminal(made, engine, container, command=("/no/such/program",))
    reason = await asyncio.wait_for(task, 10)
    # Docker reports a missing program either at start (error) or as exit code 126/127.
    assert reason in ("error", "exited")
    assert sink.texts[-1]["reason"] == reason and (reason == "error" or sink.texts[-1]["exitCode"] in (126, 127))

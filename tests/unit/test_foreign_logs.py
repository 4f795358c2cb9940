"""Other libraries' log records (standard `logging`) come out as the agent's own
lines do: one JSON line each, with level, timestamp and `logger`, through the
secret scrubber, with the journald priority, at levels SIGHUP can change.

The aiohttp and APScheduler messages are the libraries' own, provoked for real:
a request handler that raises on a server on 127.0.0.1, a job that raises."""

from __future__ import annotations

import io
import json
import logging
from datetime import datetime, timezone

import aiohttp
import pytest
from aiohttp import web
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from support.waiting import until

from gpuhost_agent.common import library_logs, logs

SECRET = "lib-secret-7f3a9c"


@pytest.fixture
def agent_logs():
    """Output at info level (the agent's default) into a buffer, with SECRET
    registered; the JSON-ness of every line is checked after the test."""
    stream = io.StringIO()
    logs.configure("info", json_lines=True, stream=stream)
    logs.SECRETS.add(SECRET)
    try:
        yield stream
    finally:
        logs.SECRETS.discard_many([SECRET])
        logs.configure("warning", json_lines=True)
    assert SECRET not in stream.getvalue()
    for line in stream.getvalue().splitlines():
        json.loads(line)


def _lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def _from(stream: io.StringIO, prefix: str) -> list[dict]:
    return [line for line in _lines(stream) if line.get("logger", "").startswith(prefix)]


async def test_an_aiohttp_handler_error_is_one_scrubbed_json_line(agent_logs):
    async def failing(_request):
        raise RuntimeError(f"upstream refused key {SECRET}")

    app = web.Application()
    app.router.add_get("/fail", failing)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/fail") as response:
                assert response.status == 500
        await until(lambda: _from(agent_logs, "aiohttp"), 5)
    finally:
        await runner.cleanup()

    [line] = _from(agent_logs, "aiohttp")
    assert line["logger"] == "aiohttp.server" and line["level"] == "error"
    assert line["event"] == "Error handling request from 127.0.0.1"
    assert "RuntimeError: upstream refused key ***" in line["exception"]
    assert "Traceback" in line["exception"] and line["timestamp"].endswith("Z")


async def test_an_apscheduler_job_error_is_one_scrubbed_json_line(agent_logs):
    """The secret is in the job's name, which APScheduler passes as a %s
    argument, and in the exception's text."""

    async def sync_job():
        raise ValueError(f"marketplace answered 401 for {SECRET}")

    scheduler = AsyncIOScheduler(timezone="UTC")
    scheduler.add_job(sync_job, "date", run_date=datetime.now(timezone.utc), name=f"sync-{SECRET}")
    scheduler.start()
    try:
        await until(lambda: _from(agent_logs, "apscheduler"), 5)
    finally:
        scheduler.shutdown(wait=False)

    [line] = _from(agent_logs, "apscheduler")  # at info, its routine INFO lines stay out
    assert line["logger"] == "apscheduler.executors.default" and line["level"] == "error"
    assert line["event"].startswith('Job "sync-*** (trigger: date[') and line["event"].endswith("raised an exception")
    assert "ValueError: marketplace answered 401 for ***" in line["exception"]
    assert logs.LAST_ERROR.get()["event"] == line["event"], "status shows a library's error too, scrubbed"


def test_a_secret_in_a_message_its_arguments_or_a_bad_format_is_masked(agent_logs):
    library = logging.getLogger("some.library")
    library.warning(f"connecting with {SECRET}")
    library.warning("retrying with %s after %d s", SECRET, 3)
    # Straight to the agent's handler: pytest's own capture handler raises on this one.
    [handler] = [h for h in logging.getLogger().handlers if isinstance(h, library_logs.LineHandler)]
    handler.handle(library.makeRecord("some.library", logging.ERROR, __file__, 0, "cannot format %d", (SECRET,), None))
    lines = _from(agent_logs, "some.library")
    assert [line["event"] for line in lines] == [
        "connecting with ***",
        "retrying with *** after 3 s",
        "cannot format %d (unformattable arguments dropped)",
    ]
    assert [line["level"] for line in lines] == ["warning", "warning", "error"]


def test_library_lines_on_the_journal_carry_the_syslog_priority():
    stream = io.StringIO()
    logs.configure("info", json_lines=True, stream=stream, journal=True)
    try:
        logging.getLogger("asyncio").error("Task exception was never retrieved")
        logging.getLogger("urllib3.connectionpool").warning("Connection pool is full")
    finally:
        logs.configure("warning", json_lines=True)
    lines = stream.getvalue().splitlines()
    assert [line[:3] for line in lines] == ["<3>", "<4>"]
    assert json.loads(lines[0][3:])["logger"] == "asyncio"


async def test_library_levels_follow_the_agent_and_sighup(agent_logs):
    """At info, APScheduler's routine lines are held back; at debug they come;
    at warning, any library's info is held back. set_level is what SIGHUP calls."""
    scheduler = AsyncIOScheduler(timezone="UTC")
    scheduler.start()  # "Scheduler started", at INFO: held back
    logging.getLogger("docker.api").info("an info from another library")  # shown at info
    logs.set_level("debug")
    scheduler.shutdown(wait=False)  # "Scheduler has been shut down", at INFO: shown
    await until(lambda: _from(agent_logs, "apscheduler"), 5)  # shutdown runs as a loop callback
    logs.set_level("warning")
    logging.getLogger("docker.api").info("hidden at warning")
    logging.getLogger("apscheduler").info("hidden at warning too")
    logs.set_level("info")
    events = [line["event"] for line in _lines(agent_logs)]
    assert "an info from another library" in events and "Scheduler has been shut down" in events
    assert "Scheduler started" not in events and not [event for event in events if "hidden" in event]
    assert logging.getLogger("apscheduler").getEffectiveLevel() == logging.WARNING


def test_asyncssh_says_its_warnings_alone_unless_the_agent_runs_at_debug(agent_logs):
    """asyncssh's info lines were 69 % of a busy agent's journal, free text with
    renters' command lines among them: held back but at debug."""
    ssh = logging.getLogger("asyncssh")
    ssh.info("[conn=1, chan=0] Command: HF_TOKEN=x sh -c train")
    ssh.warning("[conn=1] a warning of asyncssh's")
    logs.set_level("debug")
    ssh.info("[conn=2] shown at debug")
    logs.set_level("info")
    events = [line["event"] for line in _from(agent_logs, "asyncssh")]
    assert events == ["[conn=1] a warning of asyncssh's", "[conn=2] shown at debug"], events


def test_configure_again_replaces_its_handler_and_keeps_others():
    root = logging.getLogger()
    other = logging.NullHandler()
    root.addHandler(other)
    try:
        before = len(root.handlers)
        logs.configure("info", json_lines=True, stream=io.StringIO())
        logs.configure("warning", json_lines=True)
        assert len(root.handlers) == before and other in root.handlers
    finally:
        root.removeHandler(other)

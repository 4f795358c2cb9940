"""Logs for operators: journald priorities, a request id across a job's lines,
the level changed at run time. (SIGHUP, and no secret in a full deploy's output:
tests/integration/test_operator_logs_engine.py.)"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re

import pytest
from support.stacks import job_payload
from support.waiting import until
from support.wiring import dispatcher_for

from gpuhost_agent.common import logs
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.outbox import Outbox

STABLE_KEYS = ("event", "stack_id", "rental_id", "job_id", "container", "error")


def _lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


# --- journald priority -------------------------------------------------------


def _log_into(path, monkeypatch, journal_stream: str | None):
    if journal_stream is None:
        monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    else:
        monkeypatch.setenv("JOURNAL_STREAM", journal_stream)
    with open(path, "w") as stream:
        logs.configure("debug", json_lines=True, stream=stream)
        try:
            log = logs.get_logger("test")
            log.debug("a_debug", job_id="j1")
            log.info("an_info")
            log.warning("a_warning", error="disk full")
            log.error("an_error")
            try:
                raise RuntimeError("boom")
            except RuntimeError:
                log.exception("an_exception")
            log.critical("a_critical")
        finally:
            logs.configure("warning", json_lines=True)
    return path.read_text().splitlines()


def test_lines_on_the_journal_carry_the_syslog_priority(tmp_path, monkeypatch):
    path = tmp_path / "journal"
    path.touch()
    info = os.stat(path)
    lines = _log_into(path, monkeypatch, f"{info.st_dev}:{info.st_ino}")
    assert len(lines) == 6, "one event per line, the traceback included"
    priorities = []
    for line in lines:
        match = re.fullmatch(r"<(\d)>(\{.*\})", line)
        assert match, line
        priorities.append((json.loads(match.group(2))["event"], int(match.group(1))))
    assert priorities == [
        ("a_debug", 7),
        ("an_info", 6),
        ("a_warning", 4),
        ("an_error", 3),
        ("an_exception", 3),
        ("a_critical", 2),
    ]
    assert json.loads(lines[0][3:])["job_id"] == "j1"


@pytest.mark.parametrize("journal_stream", [None, "1:2", "garbage"])
def test_lines_elsewhere_are_plain_json(tmp_path, monkeypatch, journal_stream):
    lines = _log_into(tmp_path / "file", monkeypatch, journal_stream)
    assert [json.loads(line)["event"] for line in lines] == [
        "a_debug",
        "an_info",
        "a_warning",
        "an_error",
        "an_exception",
        "a_critical",
    ]
    assert json.loads(lines[2])["level"] == "warning" and json.loads(lines[2])["error"] == "disk full"


def test_stringio_and_explicit_choice(monkeypatch):
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")
    assert not logs.stream_is_journal(io.StringIO())
    stream = io.StringIO()
    logs.configure("info", json_lines=True, stream=stream, journal=True)
    try:
        logs.get_logger("t").warning("forced")
    finally:
        logs.configure("warning", json_lines=True)
    assert stream.getvalue().startswith("<4>{")


def test_set_level_at_run_time(log_stream):
    log = logs.get_logger("t")
    logs.set_level("warning")
    log.info("hidden")
    log.warning("shown")
    logs.set_level("debug")
    log.debug("shown_too")
    with pytest.raises(ValueError):
        logs.set_level("loud")
    log.debug("still_debug")
    assert [line["event"] for line in _lines(log_stream)] == ["shown", "shown_too", "still_debug"]
    assert logs.current_level() == "debug"


# --- a request id across a job's lines ---------------------------------------


class LoggingDeployer:
    """Logs from the job's task, from a task it starts and from a thread, as the
    real deployer and Compose runner do."""

    def __init__(self):
        self.log = logs.get_logger("fake-deployer")

    async def deploy(self, job, stops=None):
        self.log.info("fake_deploy_step", step=1)
        await asyncio.create_task(self._inner())
        await asyncio.to_thread(lambda: self.log.info("fake_deploy_thread"))
        return ""

    async def _inner(self):
        await asyncio.sleep(0)
        self.log.warning("fake_deploy_inner", container="app-1")

    async def remove(self, job):
        self.log.info("fake_remove")
        return ""


async def test_every_line_of_a_job_carries_its_ids_and_one_request_id(log_stream):
    outbox = Outbox(lambda report: asyncio.sleep(0), AgentDB(None))
    dispatcher = dispatcher_for(LoggingDeployer(), outbox)
    dispatcher.submit(job_payload("job-a", "stack-a"))
    dispatcher.submit(job_payload("job-b", "stack-b"))
    await until(lambda: not dispatcher._running)
    logs.get_logger("t").info("after_the_jobs")

    lines = _lines(log_stream)
    by_job: dict[str, list[dict]] = {}
    for line in lines:
        if line["event"] == "after_the_jobs":
            assert "request_id" not in line and "job_id" not in line, "the binding ends with the job"
            continue
        if "job_id" in line:
            by_job.setdefault(line["job_id"], []).append(line)
    assert set(by_job) == {"job-a", "job-b"}
    request_ids = set()
    for job_id, job_lines in by_job.items():
        events = [line["event"] for line in job_lines]
        assert events[0] == "job_started" and events[-1] == "job_finished"
        assert {"fake_deploy_step", "fake_deploy_inner", "fake_deploy_thread"} <= set(events)
        ids = {line.get("request_id") for line in job_lines}
        assert len(ids) == 1 and re.fullmatch(r"[0-9a-f]{12}", ids.pop() or "")
        request_ids |= {job_lines[0]["request_id"]}
        for line in job_lines:
            assert line["stack_id"] == job_id.replace("job", "stack") and line["rental_id"] == "rental-1"
    assert len(request_ids) == 2, "each job run has its own request id"
    inner = next(line for line in lines if line["event"] == "fake_deploy_inner")
    assert inner["container"] == "app-1" and inner["level"] == "warning"

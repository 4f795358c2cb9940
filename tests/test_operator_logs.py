"""Logs for operators: journald priorities, a request id across a job's lines,
the level changed at run time (SIGHUP), and no secret in a full deploy's output."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from gpuhost_agent.common import logs
from gpuhost_agent.protocol import wire
from gpuhost_agent.uplink.outbox import Outbox
from gpuhost_agent.storage.agent_db import AgentDB
from wiring_fakes import dispatcher_for
from conftest import SLEEPER, remove_env_resources, until

STABLE_KEYS = ("event", "stack_id", "rental_id", "job_id", "container", "error")


@pytest.fixture
def log_stream():
    """All log output at debug level, as JSON lines, into a buffer; restored after."""
    stream = io.StringIO()
    logs.configure("debug", json_lines=True, stream=stream)
    try:
        yield stream
    finally:
        logs.configure("warning", json_lines=True)


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
    assert priorities == [("a_debug", 7), ("an_info", 6), ("a_warning", 4), ("an_error", 3),
                          ("an_exception", 3), ("a_critical", 2)]
    assert json.loads(lines[0][3:])["job_id"] == "j1"


@pytest.mark.parametrize("journal_stream", [None, "1:2", "garbage"])
def test_lines_elsewhere_are_plain_json(tmp_path, monkeypatch, journal_stream):
    lines = _log_into(tmp_path / "file", monkeypatch, journal_stream)
    assert [json.loads(line)["event"] for line in lines] == [
        "a_debug", "an_info", "a_warning", "an_error", "an_exception", "a_critical"]
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

    async def deploy(self, job):
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

    def report_status(self, *args):
        pass


def _job(job_id: str, stack_id: str, job_type: str = wire.JOB_DEPLOY) -> dict:
    return {"jobId": job_id, "type": job_type, "stackId": stack_id, "rentalId": "rental-1", "envId": "env-1",
            "stackName": "s", "template": {"name": "s", "description": "", "content": SLEEPER,
                                           "environmentVariables": {}}}


async def test_every_line_of_a_job_carries_its_ids_and_one_request_id(log_stream):
    outbox = Outbox(lambda report: asyncio.sleep(0), AgentDB(None))
    dispatcher = dispatcher_for(LoggingDeployer(), outbox)
    dispatcher.submit(_job("job-a", "stack-a"))
    dispatcher.submit(_job("job-b", "stack-b"))
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


# --- nothing secret in a full deploy ------------------------------------------

SECRET_VALUE = "s3cret-value-XYZ"


@pytest.fixture
def log_audit(log_stream):
    """Checked after local_market's teardown too (requested before it, so torn
    down after it): the agent's stop is part of the output searched."""
    secrets: list[str] = []
    yield log_stream, secrets
    output = log_stream.getvalue()
    lines = output.splitlines()
    assert lines and all(isinstance(json.loads(line).get("event"), str) for line in lines)
    for secret in secrets:
        assert secret not in output


@pytest.mark.docker
async def test_a_full_deploy_logs_no_secret(log_audit, local_market):
    stream, secrets = log_audit
    renter, parts, local = local_market
    secrets += [local.state.store.envApiKey, local.state.store.renterApiKey, SECRET_VALUE, "another-secret-42"]
    rental_id = await renter.rental()
    variables = {"TOKEN": SECRET_VALUE, "OTHER": "another-secret-42"}
    content = SLEEPER + "    environment:\n      TOKEN: ${TOKEN}\n      OTHER: ${OTHER}\n"
    stack_id = await renter.stack(rental_id, content, variables)
    assert (await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR)))["status"] == wire.APPLIED
    await until(lambda: not parts.dispatcher._running, 30)
    # a failing deploy whose Compose error may echo the values
    bad_id = await renter.stack(rental_id, "services:\n  app:\n    image: ${TOKEN}/${OTHER}:x\n", variables)
    assert (await renter.wait_stack(rental_id, bad_id, (wire.APPLIED, wire.ERROR)))["status"] == wire.ERROR
    await until(lambda: not parts.dispatcher._running, 30)

    output = stream.getvalue()
    lines = _lines(stream)
    events = {line["event"] for line in lines}
    assert {"job_started", "stack_applying", "stack_applied", "stack_failed", "job_finished"} <= events, events
    assert all(isinstance(line.get("event"), str) for line in lines)
    job_lines = [line for line in lines if line.get("stack_id") == stack_id and "job_id" in line]
    assert len({line.get("request_id") for line in job_lines}) == 1
    for secret in secrets:
        assert secret not in output


# --- SIGHUP reloads the configuration ----------------------------------------

def _wait_for(path, predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if predicate(lines):
            return lines
        time.sleep(0.1)
    raise AssertionError(f"not seen in time: {path.read_text()[-3000:]}")


def test_sighup_reloads_the_log_level(tmp_path, docker_client):
    conf = tmp_path / "agent.conf"
    conf.write_text("GPUHOST_LOG_LEVEL=info\nGPUHOST_SETTLE_SECONDS=0.5\n")
    env = {**os.environ, "GPUHOST_LOCAL_API_KEY": "sighup-test-key", "GPUHOST_CONFIG": str(conf)}
    env.pop("GPUHOST_LOG_LEVEL", None)
    env.pop("JOURNAL_STREAM", None)
    stderr = tmp_path / "stderr"
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuhost_agent", "run", "--state-dir", str(tmp_path / "state"),
         "--local-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=open(stderr, "w"), text=True, env=env,
    )
    env_id = None
    try:
        banner = "".join(process.stdout.readline() for _ in range(4))
        env_id = re.search(r"environment id:\s+(\S+)", banner).group(1)
        _wait_for(stderr, lambda lines: any(line["event"] == "session_opened" for line in lines))
        before = [json.loads(line) for line in stderr.read_text().splitlines()]
        assert before and all(line["level"] != "debug" for line in before)

        conf.write_text("GPUHOST_LOG_LEVEL=debug\nGPUHOST_SETTLE_SECONDS=0.5\n")
        process.send_signal(signal.SIGHUP)
        lines = _wait_for(stderr, lambda lines: any(line["event"] == "config_in_effect" for line in lines))
        reloaded = next(i for i, line in enumerate(lines) if line["event"] == "config_reloaded")
        assert lines[reloaded]["log_level"] == "debug" and lines[reloaded]["level"] == "info"
        assert any(line["level"] == "debug" for line in lines[reloaded + 1:])

        conf.write_text("GPUHOST_LOG_LEVEL=loud\n")
        process.send_signal(signal.SIGHUP)
        lines = _wait_for(stderr, lambda lines: any(line["event"] == "config_reload_failed" for line in lines))
        failed = next(line for line in lines if line["event"] == "config_reload_failed")
        assert "loud" in failed["error"] and failed["level"] == "error" and failed["log_level"] == "debug"

        conf.write_text("GPUHOST_LOG_LEVEL=warning\n")
        process.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert process.poll() is None, "SIGHUP does not stop the agent"
        before_stop = len(stderr.read_text().splitlines())  # start-up work may still log until the reload
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        lines = [json.loads(line) for line in stderr.read_text().splitlines()]
        assert all(line["level"] in ("warning", "error", "critical") for line in lines[before_stop:]), \
            "at warning, the info lines of the shutdown are filtered"
        assert "sighup-test-key" not in stderr.read_text()
    finally:
        if process.poll() is None:
            process.kill()
        if env_id:
            remove_env_resources(docker_client, env_id)

"""`gpuhost-agent status` and the metrics endpoint: the status socket of a built
(not running) agent, its JSON, its permissions, the Prometheus text, and the
messages when the agent is not there."""

from __future__ import annotations

import asyncio
import io
import json
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.agent_config import make_config

from gpuhost_agent.common import logs
from gpuhost_agent.common.unix_http import UnixHTTPConnection
from gpuhost_agent.core.reconcile.plan import Action
from gpuhost_agent.protocol import wire_time
from gpuhost_agent.service import metrics
from gpuhost_agent.service.status import cli as status_cli
from gpuhost_agent.service.status import server as status_server
from gpuhost_agent.service.wiring import build_agent, start_status_server


def parse_prometheus(text: str) -> tuple[dict[str, str], list[tuple[str, dict, float]]]:
    """(types by family, samples), read by prometheus_client's own parser: what
    a Prometheus server would make of the text."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    samples: list[tuple[str, dict, float]] = []
    for family in text_string_to_metric_families(text):
        name = f"{family.name}_total" if family.type == "counter" else family.name
        assert name not in types, f"family {name} declared twice"
        types[name] = family.type
        samples += [(sample.name, sample.labels, sample.value) for sample in family.samples]
    return types, samples


def _value(samples, name, **labels) -> float:
    found = [v for n, got, v in samples if n == name and all(got.get(k) == str(x) for k, x in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


# ---- metrics.py -----------------------------------------------------------------------------
def test_label_values_are_escaped_and_parse_back():
    nasty = 'GPU-"quoted"\\back\nline'
    types, samples = parse_prometheus(metrics.render({"gpus": [{"index": 0, "uuid": nasty, "powerW": 1.5}]}).decode())
    assert types["gpuhost_gpu_power_watts"] == "gauge"
    assert _value(samples, "gpuhost_gpu_power_watts", uuid=nasty, index=0) == 1.5


def test_histogram_is_cumulative_per_label_set():
    histogram = metrics.deploy_histogram()
    for seconds, outcome in ((0.5, "succeeded"), (5, "succeeded"), (50, "succeeded"), (2, "failed")):
        histogram.labels(outcome=outcome).observe(seconds)
    types, samples = parse_prometheus(metrics.render({"deploy_durations": histogram}).decode())
    assert types["gpuhost_deploy_duration_seconds"] == "histogram"
    bucket = "gpuhost_deploy_duration_seconds_bucket"
    assert [_value(samples, bucket, outcome="succeeded", le=le) for le in ("1.0", "10.0", "+Inf")] == [1, 2, 3]
    assert [_value(samples, bucket, outcome="failed", le=le) for le in ("1.0", "10.0", "+Inf")] == [0, 1, 1]
    assert _value(samples, "gpuhost_deploy_duration_seconds_sum", outcome="succeeded") == 55.5
    assert _value(samples, "gpuhost_deploy_duration_seconds_count", outcome="failed") == 1


def test_collect_from_figures():
    histogram = metrics.deploy_histogram()
    histogram.labels(outcome="succeeded").observe(12.0)
    figures = {
        "uptime_seconds": 5.0,
        "connected": True,
        "jobs": {"succeeded": 4, "failed": 1},
        "jobs_running": 0,
        "deploy_durations": histogram,
        "reports": {"pending": 2, "sent": 9, "rejected": 0, "dropped": 1},
        "reconnects": 3,
        "engine_up": False,
        "engine_outages": 2,
        "reconcile_runs": 7,
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-abc",
                "utilizationPercent": 87,
                "memoryUsedBytes": 1024,
                "temperatureC": 61,
                "powerW": 250.5,
            },
            {
                "index": 1,
                "uuid": "GPU-def",
                "utilizationPercent": None,
                "memoryUsedBytes": 0,
                "temperatureC": None,
                "powerW": None,
            },
            {"index": 2, "error": "handle: not supported"},
        ],
    }
    types, samples = parse_prometheus(metrics.render(figures).decode())
    assert types["gpuhost_jobs_total"] == "counter" and types["gpuhost_deploy_duration_seconds"] == "histogram"
    assert _value(samples, "gpuhost_jobs_total", outcome="succeeded") == 4
    assert _value(samples, "gpuhost_jobs_total", outcome="failed") == 1
    assert _value(samples, "gpuhost_reports_pending") == 2
    assert _value(samples, "gpuhost_reports_dropped_total") == 1
    assert _value(samples, "gpuhost_marketplace_reconnects_total") == 3
    assert _value(samples, "gpuhost_engine_outages_total") == 2
    assert _value(samples, "gpuhost_engine_up") == 0
    assert _value(samples, "gpuhost_gpu_utilization_percent", uuid="GPU-abc", index=0) == 87
    assert _value(samples, "gpuhost_gpu_power_watts", uuid="GPU-abc", index=0) == 250.5
    assert _value(samples, "gpuhost_gpu_memory_used_bytes", uuid="GPU-def", index=1) == 0
    assert not [s for s in samples if s[0] == "gpuhost_gpu_temperature_celsius" and s[1]["index"] == "1"]
    assert not [s for s in samples if s[1].get("index") == "2"]
    # figures not counted yet (no hook) are left out, the families still declared
    _, bare = parse_prometheus(metrics.render({"reports": {"pending": 0}}).decode())
    assert not [s for s in bare if s[0] == "gpuhost_marketplace_reconnects_total"]
    assert not [s for s in bare if s[0] == "gpuhost_heartbeat_last_success_timestamp_seconds"]


def test_the_figures_the_alerts_judge():
    """What prometheus/gpuhost-agent-alerts.yml asks of the agent."""
    figures = {
        "heartbeat_last_at": "2026-12-07T10:00:00.000000Z",
        "gpus_out_of_service": {"GPU-abc": "Xid 79 (the GPU has fallen off the bus)"},
        "compliance": {
            "checks": [{"id": "driver-version", "ok": True}, {"id": "container-egress-confined", "ok": False}]
        },
        "rentals_over_disk_share": 1,
        "upgrade_last_attempt": {"version": "0.2.0", "outcome": "rolled-back", "at": "2026-12-07T09:00:00.000000Z"},
    }
    types, samples = parse_prometheus(metrics.render(figures).decode())
    assert _value(samples, "gpuhost_heartbeat_last_success_timestamp_seconds") == 1796637600.0
    assert _value(samples, "gpuhost_gpu_out_of_service", uuid="GPU-abc") == 1
    assert _value(samples, "gpuhost_compliance_check_ok", check="driver-version") == 1
    assert _value(samples, "gpuhost_compliance_check_ok", check="container-egress-confined") == 0
    assert _value(samples, "gpuhost_rentals_over_disk_share") == 1
    assert _value(samples, "gpuhost_upgrade_last_attempt_timestamp_seconds", outcome="rolled-back") == 1796634000.0


# ---- the status socket ----------------------------------------------------------------------
@pytest.fixture
def short_dir():
    """Unix socket paths must stay under 108 bytes; pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="gh-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def parts(tmp_path):
    built = build_agent(make_config(tmp_path / "state"), "http://127.0.0.1:9/v1", "status-test-api-key")
    yield built
    await built.client.close()
    await built.engine.close()
    built.nvml.close()
    built.db.close()


def _seed(parts) -> None:
    db = parts.db
    db.stack_status("stk-1", "rent-1", "env-1", "gh-stk-1", "running")
    db.stack_status("stk-2", "rent-1", "env-1", "gh-stk-2", "error", "compose failed: status-test-api-key leaked")
    db.rental_end_date("rent-1", "2030-01-01T00:00:00Z")
    for job_id, error in (("job-1", ""), ("job-2", "x"), ("job-3", "")):  # as the dispatcher finishes jobs
        parts.dispatcher._finish(job_id, error)
    parts.session.env_id = "env-1"
    parts.reconciler.runs = 2
    parts.reconciler.last_actions = [Action("report", "stk-2", "rent-1", "container exited")]


async def _get(path: Path, url: str = "/status"):
    return await asyncio.to_thread(status_cli.fetch, path, url)


async def test_status_over_the_socket(parts, short_dir):
    _seed(parts)
    sock = short_dir / "run" / "agent.sock"
    server = await start_status_server(parts, sock, local_marketplace=False)
    try:
        assert stat.S_ISSOCK((await asyncio.to_thread(sock.lstat)).st_mode)
        assert stat.S_IMODE((await asyncio.to_thread(sock.lstat)).st_mode) == 0o600
        assert stat.S_IMODE((await asyncio.to_thread(sock.parent.stat)).st_mode) == 0o700
        status = await asyncio.to_thread(status_cli.fetch_status, sock)
        assert status["running"] is True and status["pid"] == os.getpid()
        process = status["process"]  # the footprint a soak judges: this test process's own
        assert process["rssBytes"] > 10 << 20 and process["openFiles"] > 3 and process["threads"] >= 1
        assert process["asyncioTasks"] >= 2  # this test and the server's handler at least
        assert status["connected"] is False
        assert status["envId"] == "env-1"
        assert status["marketplace"] == "http://127.0.0.1:9/v1"
        assert status["initState"]["state"] == "starting"
        assert {s["stackId"]: s["status"] for s in status["stacks"]} == {"stk-1": "running", "stk-2": "error"}
        assert "status-test-api-key" not in json.dumps(status)  # scrubbed like log lines
        assert status["rentals"][0]["rentalId"] == "rent-1"
        assert status["jobs"]["outcomes"] == {"succeeded": 2, "failed": 1}
        assert status["reports"]["pending"] == parts.outbox.pending()
        assert status["reconcile"] == {
            "runs": 2,
            "lastActions": [{"kind": "report", "target": "stk-2", "why": "container exited"}],
        }
        assert set(status["heartbeat"]) >= {"lastAt", "failures", "intervalSeconds"}
        assert status["metricsEnabled"] is False
        code, body = await _get(sock, "/metrics")
        assert code == 404 and b"GPUHOST_METRICS" in body

        parts.session.connected.set()
        out = io.StringIO()
        code = await asyncio.to_thread(status_cli.run, sock, False, out=out)
        text = out.getvalue()
        assert code == 0
        assert "running (pid" in text and "connected:       yes" in text
        assert re.search(r"\n  process: +[0-9.]+ MiB resident, \d+ open files, \d+ threads, \d+ asyncio tasks\n", text)
        assert re.search(r'\n  stk-2 "gh" rental rent-1 error, updated .*\n    error: compose failed: \*\*\*', text)
        out = io.StringIO()
        assert await asyncio.to_thread(status_cli.run, sock, True, out=out) == 0
        assert json.loads(out.getvalue())["connected"] is True
    finally:
        await server.stop()
    assert not await asyncio.to_thread(sock.exists)


async def test_metrics_over_the_socket(parts, short_dir):
    _seed(parts)
    parts.dispatcher.deploy_durations.labels(outcome="succeeded").observe(42.0)
    parts.session.reconnects = 1
    sock = short_dir / "agent.sock"
    server = await start_status_server(parts, sock, metrics_enabled=True, metrics_listen=("127.0.0.1", 0))
    try:
        code, body = await _get(sock, "/metrics")
        assert code == 200
        types, samples = parse_prometheus(body.decode())
        assert _value(samples, "gpuhost_jobs_total", outcome="succeeded") == 2
        assert _value(samples, "gpuhost_reports_pending") == parts.outbox.pending()
        assert _value(samples, "gpuhost_marketplace_reconnects_total") == 1
        assert _value(samples, "gpuhost_deploy_duration_seconds_count", outcome="succeeded") == 1
        assert types["gpuhost_gpu_utilization_percent"] == "gauge"
        # the figures the shipped alerts judge, read from the running parts
        assert types["gpuhost_gpu_out_of_service"] == "gauge"
        assert types["gpuhost_rentals_over_disk_share"] == "gauge"
        parts.ledger.mark_out_of_service("GPU-x", "Xid 79")
        parts.disk_watch.last_over = {"rental-1"}
        code, body = await _get(sock, "/metrics")
        _, samples = parse_prometheus(body.decode())
        assert _value(samples, "gpuhost_gpu_out_of_service", uuid="GPU-x", reason="Xid 79") == 1
        assert _value(samples, "gpuhost_rentals_over_disk_share") == 1
        # the same text on loopback
        reader, writer = await asyncio.open_connection("127.0.0.1", server.metrics_port)
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        raw = await reader.read()
        writer.close()
        assert raw.split(b" ")[1] == b"200" and b"gpuhost_jobs_total" in raw
        assert (await asyncio.to_thread(status_cli.fetch_status, sock))["metricsEnabled"] is True
    finally:
        await server.stop()


async def test_metrics_listen_must_be_loopback(parts, short_dir):
    server = status_server.StatusServer(
        status_server.StatusSource(parts, metrics_enabled=True), short_dir / "agent.sock", ("0.0.0.0", 0)
    )
    with pytest.raises(status_server.StatusSocketError, match="loopback"):
        await server.start()
    await server.stop()


async def test_stale_socket_is_replaced_live_one_and_files_are_not(parts, short_dir):
    sock = short_dir / "agent.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))
    stale.close()  # a socket file nobody listens on: what a killed agent leaves
    server = await start_status_server(parts, sock)
    try:
        assert (await asyncio.to_thread(status_cli.fetch_status, sock))["running"] is True
        with pytest.raises(status_server.StatusSocketError, match="already running"):
            await start_status_server(parts, sock)
    finally:
        await server.stop()
    await asyncio.to_thread(sock.write_text, "not a socket")
    with pytest.raises(status_server.StatusSocketError, match="not a socket"):
        await start_status_server(parts, sock)
    assert await asyncio.to_thread(sock.read_text) == "not a socket"


def test_socket_path_too_long(short_dir):
    with pytest.raises(status_server.StatusSocketError, match="GPUHOST_STATUS_SOCKET"):
        status_server._prepare_socket_path(short_dir / ("x" * 120) / "agent.sock")


def test_not_running(short_dir):
    err = io.StringIO()
    missing = short_dir / "agent.sock"
    assert status_cli.run(missing, out=io.StringIO(), err=err) == status_cli.EXIT_NOT_RUNNING == 3
    assert err.getvalue().strip() == f"gpuhost-agent is not running (no status socket at {missing})"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(missing))  # a socket file, nobody listening: connection refused
    try:
        err = io.StringIO()
        assert status_cli.run(missing, True, out=io.StringIO(), err=err) == 3
        assert "is not running" in err.getvalue()
    finally:
        dead.close()


def test_permission_denied_says_root(monkeypatch, short_dir):
    def refuse(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(status_cli.UnixHTTPConnection, "connect", refuse)
    err = io.StringIO()
    assert status_cli.run(short_dir / "agent.sock", err=err) == status_cli.EXIT_DENIED == 4
    assert "root" in err.getvalue() and "sudo" in err.getvalue()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
async def test_other_users_cannot_open_the_socket(parts, short_dir):
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    short_dir.chmod(0o755)  # let nobody reach the socket's own directory: the socket's 0600 must hold alone
    sock = short_dir / "agent.sock"
    server = await start_status_server(parts, sock)
    try:
        code = f"import sys; from gpuhost_agent.service.status import cli; sys.exit(cli.run({str(sock)!r}))"
        src = str(Path(status_cli.__file__).parents[3])
        # the client needs only the stdlib
        python = await asyncio.to_thread(shutil.which, "python3", path="/usr/bin:/bin") or sys.executable
        try:
            result = await asyncio.to_thread(
                subprocess.run,
                [python, "-c", code],
                capture_output=True,
                text=True,
                timeout=30,
                user=nobody.pw_uid,
                group=nobody.pw_gid,
                extra_groups=[],
                cwd="/",
                env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"},
            )
        except PermissionError as exc:
            pytest.skip(f"no Python that user nobody may run here: {exc}")
        if "ModuleNotFoundError" in result.stderr or "Permission denied: '" in result.stderr:
            pytest.skip(f"the venv is not usable by nobody here: {result.stderr[-200:]}")
        assert result.returncode == 4, result.stderr
        assert "root" in result.stderr
    finally:
        await server.stop()


# ---- the last error, as `status` shows it ------------------------------------------------------
def test_last_error_recorder_keeps_newest_warning_or_error():
    recorder = logs.LastError()
    event = {"event": "job_poll_failed", "level": "info", "timestamp": "t0"}
    assert recorder(None, "info", dict(event)) == event
    assert recorder.get() is None
    recorder(
        None,
        "warning",
        {"event": "heartbeat_failed", "level": "warning", "timestamp": "t1", "error": "refused", "other": "ignored"},
    )
    recorder(
        None,
        "error",
        {
            "event": "docker_unreachable",
            "level": "error",
            "timestamp": "t2",
            "error": "no socket",
            "hint": "start docker",
            "stack_id": "stk-1",
        },
    )
    assert recorder.get() == {
        "at": "t2",
        "level": "error",
        "event": "docker_unreachable",
        "error": "no socket",
        "hint": "start docker",
        "stack_id": "stk-1",
    }
    assert recorder.counts == {"warning": 1, "error": 1}


def test_render_shows_last_error_and_no_stacks():
    text = status_cli.render(
        {
            "version": "0.1.0",
            "pid": 1,
            "since": wire_time.iso(),
            "connected": False,
            "initState": {"state": "failed", "phase": "docker", "error": "docker: down"},
            "lastError": {
                "at": "t",
                "level": "error",
                "event": "docker_unreachable",
                "error": "no socket",
                "hint": "start docker",
            },
            "heartbeat": {"lastAt": None, "failures": 3},
            "stacks": [],
        }
    )
    assert "connected:       NO" in text
    assert "failed (phase docker): docker: down" in text
    assert "docker_unreachable: no socket" in text and "hint: start docker" in text
    assert "last heartbeat:  never, 3 failed since" in text
    assert "stacks: none" in text


def test_non_root_is_told_the_system_socket_is_roots(monkeypatch, short_dir):
    locked = short_dir / "locked"
    locked.mkdir(mode=0o700)
    real_lstat = Path.lstat

    def lstat(self):
        if self == locked / "agent.sock":
            raise PermissionError(13, "Permission denied")
        return real_lstat(self)

    monkeypatch.setattr(Path, "lstat", lstat)
    monkeypatch.setattr(status_cli.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(status_cli, "SYSTEM_SOCKET", locked / "agent.sock")
    err = io.StringIO()
    assert status_cli.run(short_dir / "mine.sock", err=err) == 4
    assert "sudo gpuhost-agent status" in err.getvalue()


def test_a_failed_connect_leaves_no_socket_open(short_dir):
    """The shared unix HTTP connection (common/unix_http.py) closes the socket a
    connect failed on: the pull's thread and the status command both retry."""
    before = set(os.listdir("/proc/self/fd"))
    failures = []  # held: their tracebacks keep connect's frame, and a socket it did not close, alive
    for _ in range(20):
        connection = UnixHTTPConnection(str(short_dir / "nobody-here.sock"), 1.0, connect_timeout=0.5)
        with pytest.raises(FileNotFoundError) as failed:
            connection.connect()
        failures.append(failed.value)
    assert set(os.listdir("/proc/self/fd")) <= before

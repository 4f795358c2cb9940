"""`gpuhost-agent status` names the stacks, says whether the host is compliant
and why not, and lists each stack's tunnels: through the
status socket of a built (not running) agent, and as the CLI prints it."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from support.agent_config import make_config
from support.machine_samples import broken_system_data, healthy_system_data

from gpuhost_agent.core.stacks import naming
from gpuhost_agent.core.stacks.status_reporter import StackRef
from gpuhost_agent.protocol import ssh_login, wire
from gpuhost_agent.service.status import cli as status_cli
from gpuhost_agent.service.status.stacks import stack_entries
from gpuhost_agent.service.wiring import build_agent, start_status_server
from gpuhost_agent.streams.channel import _Stream
from gpuhost_agent.streams.requests import LogsRequest, SshRequest, TunnelRequest


@pytest.fixture
def short_dir():
    """Unix socket paths must stay under 108 bytes; pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="gh-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def parts(tmp_path):
    built = build_agent(make_config(tmp_path / "state"), "http://127.0.0.1:9/v1", "status-stacks-api-key")
    yield built
    await built.client.close()
    await built.engine.close()
    built.nvml.close()
    built.db.close()


def _container(name: str, service: str, state: str, ports: list[dict], *, ssh: bool = False) -> dict:
    labels = {"com.docker.compose.service": service, wire.LABEL_STACK: "stk-web"}
    if ssh:
        labels[wire.LABEL_SSH] = "true"
    return {
        "Name": name,
        "Id": f"id-{name}",
        "Created": 1,
        "Labels": sorted(f"{k}={v}" for k, v in labels.items()),
        "Ports": ports,
        "State": state,
    }


WEB = _container(
    "ui-stk-web-web-1",
    "web",
    "running",
    [
        {"PrivatePort": 8080, "Type": "tcp"},
        {"PrivatePort": 8080, "Type": "tcp", "IP": "127.0.0.1", "PublicPort": 32768},  # published too: one tunnel
        {"PrivatePort": 9999, "Type": "udp"},  # no tunnel: tunnels are TCP
    ],
    ssh=True,
)
DB = _container("ui-stk-web-db-1", "db", "exited (3)", [{"PrivatePort": 5432, "Type": "tcp"}])


def _tunnel(stream_id: str, container_id: str, port: int, stack_id: str = "stk-web") -> TunnelRequest:
    return TunnelRequest(stream_id, "rent-1", stack_id, container_id, port)


def _logged_in(request: SshRequest, stack_id: str) -> SshRequest:
    request.login.logged_in, request.login.stack_id = True, stack_id
    return request


def test_tunnels_follow_the_containers_and_count_connections():
    requests = [
        _tunnel("a", "id-ui-stk-web-web-1", 8080),
        _tunnel("b", "ui-stk-web-web-1", 8080),  # by name: the same container
        _tunnel("c", "id-ui-stk-web-web-1", 8080, stack_id="stk-other"),  # another stack's: not counted
        SshRequest("d", "rent-1", ("stk-web", "stk-other")),  # not logged in yet: may pick either
        _logged_in(SshRequest("f", "rent-1", ("stk-web", "stk-other")), "stk-web"),
        _logged_in(SshRequest("g", "rent-1", ("stk-web", "stk-other")), "stk-other"),  # another stack's login
        LogsRequest("e", "rent-1", "stk-web", "id-ui-stk-web-web-1"),  # not a tunnel
    ]
    rows = {
        "stk-web": {"status": wire.APPLIED, "project": "my-ui-stk-web", "rental_id": "rent-1", "error_msg": ""},
        "stk-new": {"status": wire.APPLYING, "project": "fresh-stk-new", "rental_id": "rent-2", "error_msg": ""},
    }
    lists = {"stk-web": [DB, WEB]}
    entries = stack_entries(rows, {"stk-web": "My UI"}, lists.get, requests)
    assert [(e["stackId"], e["name"], e["rentalId"]) for e in entries] == [
        ("stk-new", "fresh", "rent-2"),  # no name from the marketplace yet: read back from the project
        ("stk-web", "My UI", "rent-1"),
    ]
    assert entries[0]["tunnels"] is None  # no list reported yet: unknown, not "none"
    tunnels = entries[1]["tunnels"]
    assert [(t["service"], t["port"], t["protocol"], t["open"], t["connections"]) for t in tunnels] == [
        ("db", 5432, "tcp", False, 0),  # its container exited: closed
        ("web", 8080, "tcp", True, 2),
        (None, None, "ssh", True, 1),  # the login to this stack, not the one to stk-other
    ]
    assert tunnels[2]["logins"] == [ssh_login.ssh_login_name("web", "stk-web")]
    assert tunnels[2]["loggingIn"] == 1  # the connection whose login name has not come yet
    # a stack that is not APPLIED has no open tunnel, running container or not
    rows["stk-web"]["status"] = wire.ERROR
    assert not any(t["open"] for t in stack_entries(rows, {}, lists.get, requests)[1]["tunnels"])


async def test_status_names_stacks_says_compliance_and_lists_tunnels(parts, short_dir, monkeypatch):
    """Everything through the real parts: the desired state names the stack,
    the reporter's last container list gives its tunnels, the channel's open
    streams their connections, the last probe the verdict."""
    project = naming.project_name("My UI", "stk-web")
    stack = StackRef("stk-web", "rent-1", "env-1", project)
    parts.reporter.status(stack, wire.APPLIED, "container db exited with code 3", job_id="job-1")
    parts.reporter.containers("stk-web", [DB, WEB])
    parts.db.stack_status("stk-gone", "rent-1", "env-1", "gone-stk-gone", wire.APPLIED)  # from before the start
    from_job = StackRef("stk-job", "rent-1", "env-1", naming.project_name("From a job", "stk-job"), "From a job")
    parts.reporter.status(from_job, wire.APPLYING, job_id="job-3")  # a job names it; the desired state does not

    async def desired_state():
        return {
            "envId": "env-1",
            "stacks": [
                {
                    "stackId": "stk-web",
                    "rentalId": "rent-1",
                    "stackName": "My UI",
                    "desired": "present",
                    "status": wire.APPLIED,
                    "template": None,
                    "openJobs": 0,
                },
                {  # no name here: the job's stays
                    "stackId": "stk-job",
                    "rentalId": "rent-1",
                    "stackName": "",
                    "desired": "present",
                    "status": wire.APPLYING,
                    "template": None,
                    "openJobs": 1,
                },
            ],
            "rentals": [{"rentalId": "rent-1", "status": wire.RENTAL_ACTIVE, "endDate": None, "gpuCount": 0}],
        }

    monkeypatch.setattr(parts.client, "desired_state", desired_state)
    assert await parts.reconciler._desired() is not None
    stream = _Stream(_tunnel("s1", "id-ui-stk-web-web-1", 8080))
    parts.streams._streams["s1"] = stream  # as the channel holds an open tunnel stream

    monkeypatch.setattr(parts.host.prober, "system_data", _returning(broken_system_data()))
    report = await parts.host.refresh()
    failing = [check["id"] for check in report["compliance"]["checks"] if not check["ok"]]
    assert "nvidia-gpu" in failing

    sock = short_dir / "agent.sock"
    server = await start_status_server(parts, sock)
    try:
        status = await asyncio.to_thread(status_cli.fetch_status, sock)
        stacks = {s["stackId"]: s for s in status["stacks"]}
        web = stacks["stk-web"]
        assert (web["name"], web["rentalId"], web["status"], web["project"]) == ("My UI", "rent-1", "APPLIED", project)
        assert [(t["service"], t["port"], t["open"], t["connections"]) for t in web["tunnels"]] == [
            ("db", 5432, False, 0),
            ("web", 8080, True, 1),
            (None, None, True, 0),
        ]
        assert stacks["stk-gone"]["name"] == "gone" and stacks["stk-gone"]["tunnels"] is None
        assert stacks["stk-job"]["name"] == "From a job"
        verdict = status["compliance"]
        assert verdict["isCompliant"] is False and verdict["probedAt"]
        assert [c["id"] for c in verdict["checks"] if not c["ok"]] == failing

        out = io.StringIO()
        assert await asyncio.to_thread(status_cli.run, sock, False, out=out) == 0
        text = out.getvalue()
        assert f"  compliance:      NOT compliant: {', '.join(failing)}\n" in text
        nvidia = next(c for c in verdict["checks"] if c["id"] == "nvidia-gpu")
        assert f"nvidia-gpu: {nvidia['summary']}" in text and f"fix: {nvidia['remedy']}" in text
        block = text[text.index("  stk-web ") :]
        assert block.startswith('  stk-web "My UI" rental rent-1 APPLIED, updated ')
        assert "    error: container db exited with code 3" in block
        lines = [line.split() for line in block.splitlines()]
        assert ["web", "(ui-stk-web-web-1)", "8080/tcp", "open", "1", "connection"] in lines
        assert [
            "db",
            "(ui-stk-web-db-1)",
            "5432/tcp",
            "closed",
            "(container",
            "exited",
            "(3))",
            "0",
            "connections",
        ] in lines
        assert ["SSH", "endpoint", "ssh", "open", "0", "connections;", "logins", "web.stk-web"] in lines
        out = io.StringIO()
        assert await asyncio.to_thread(status_cli.run, sock, True, out=out) == 0
        assert json.loads(out.getvalue())["stacks"] == status["stacks"]

        # removed: the stack and its tunnels go; a healthy probe is compliant
        parts.reporter.status(stack, wire.REMOVED, job_id="job-2")
        assert parts.reporter.last_containers("stk-web") is None
        monkeypatch.setattr(parts.host.prober, "system_data", _returning(healthy_system_data()))
        await parts.host.refresh()
        status = await asyncio.to_thread(status_cli.fetch_status, sock)
        assert "stk-web" not in {s["stackId"] for s in status["stacks"]}
        assert status["compliance"]["isCompliant"] is True
        out = io.StringIO()
        await asyncio.to_thread(status_cli.run, sock, False, out=out)
        assert "  compliance:      compliant (" in out.getvalue()
    finally:
        await server.stop()


def _returning(value: dict):
    async def probe():
        return value

    return probe


def test_render_before_the_first_probe_and_without_tunnels():
    text = status_cli.render(
        {
            "compliance": None,
            "stacks": [
                {"stackId": "s1", "name": "a", "rentalId": "r1", "status": "APPLYING", "tunnels": None},
                {"stackId": "s2", "name": "b", "rentalId": "r1", "status": "APPLIED", "tunnels": []},
            ],
        }
    )
    assert "  compliance:      not checked yet\n" in text
    assert '  s1 "a" rental r1 APPLYING, updated never\n    tunnels: not known yet' in text
    assert '  s2 "b" rental r1 APPLIED, updated never\n    tunnels: none' in text

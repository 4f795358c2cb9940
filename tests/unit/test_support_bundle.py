"""`gpuhost-agent support-bundle`, run through the real command line against a
host made in a temporary folder: a config naming an API key file, a Swarm key
and the local marketplace's key; the local marketplace's own keys in the state
directory; a renter's stack folder there; the unit with a drop-in that holds
the key; a journal (a stand-in `journalctl`) whose lines carry every secret and
things that look like one; and a running agent (a stand-in status socket)
whose stacks carry a renter's name and error. The archive is read back with
tarfile: no planted secret and no renter's value is in any member, and each
file the manifest promises is there. No Docker Engine is needed: the bundle
says the engine could not be reached.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import re
import secrets
import shutil
import socketserver
import stat
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost_agent.common import logs
from gpuhost_agent.service import cli, support_bundle
from gpuhost_agent.service.support_bundle import Places, engine_shown, scrub, status_shown

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "gpuhost-agent.service"


def _planted(kind: str) -> str:
    return f"{kind}-planted-{secrets.token_hex(8)}"


# The values the configuration names: scrubbed wherever they appear.
API_KEY, SWARM_KEY, LOCAL_KEY, ENV_KEY = (_planted(k) for k in ("apikey", "swarmkey", "localkey", "envkey"))
MARKET_KEYS = {name: _planted(name.lower()) for name in ("envApiKey", "renterApiKey", "tunnelSecret", "releaseKey")}
# Values no configuration names, that look like credentials where they stand.
HEADER_KEY, BEARER, PEM_BODY, URL_PASSWORD, UNIT_TOKEN = (
    _planted(k) for k in ("header", "bearer", "pembody", "urlpassword", "unittoken")
)
# A renter's: in the stack's folder, and in its name and error the agent's status knows.
RENTER_VALUE, RENTER_NAME, RENTER_ERROR = (_planted(k) for k in ("rentervalue", "rentername", "rentererror"))
SECRETS = [API_KEY, SWARM_KEY, LOCAL_KEY, ENV_KEY, *MARKET_KEYS.values(), HEADER_KEY, BEARER, PEM_BODY, URL_PASSWORD]
SECRETS.append(UNIT_TOKEN)
RENTERS = [RENTER_VALUE, RENTER_NAME, RENTER_ERROR]

JOURNAL_LINES = [
    {"level": "info", "event": "agent_started", "version": "0.1.0"},
    {"level": "error", "event": "session_failed", "error": f"401 for key {API_KEY}"},
    {"level": "warning", "event": "door_refused", "error": f"Authorization: Bearer {SWARM_KEY}"},
    {"level": "warning", "event": "stderr_line", "line": f"X-API-Key: {HEADER_KEY} and Bearer {BEARER}"},
    {"level": "warning", "event": "stderr_line", "line": f"proxy https://host:{URL_PASSWORD}@proxy.example:3128"},
    {"level": "debug", "event": "local_keys", "keys": [LOCAL_KEY, ENV_KEY, *MARKET_KEYS.values()]},
    {
        "level": "error",
        "event": "stderr_line",
        "line": f"-----BEGIN OPENSSH PRIVATE KEY-----\n{PEM_BODY}\n-----END OPENSSH PRIVATE KEY-----",
    },
]


class _StatusHandler(http.server.BaseHTTPRequestHandler):
    answers: dict[str, dict] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        answer = self.answers.get(self.path)
        body = json.dumps(answer).encode()
        self.send_response(200 if answer is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _StatusServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def status_socket() -> Iterator[Path]:
    """A running agent's status socket (short path: sun_path is 108 bytes) answering /status."""
    folder = Path(tempfile.mkdtemp(prefix="gpuhost-sb-", dir="/tmp"))
    path = folder / "agent.sock"
    _StatusHandler.answers = {
        "/status": {
            "running": True,
            "version": "0.1.0",
            "lastError": {"event": "session_failed", "error": f"rejected {API_KEY}"},
            "stacks": [
                {
                    "stackId": "stack-1",
                    "name": RENTER_NAME,
                    "status": "ERROR",
                    "errorMsg": RENTER_ERROR,
                    "project": f"gh-{RENTER_NAME}",
                    "rentalId": "rental-1",
                    "updatedAt": "2026-12-01T00:00:00Z",
                    "tunnels": [{"service": RENTER_NAME, "port": 8888}],
                }
            ],
            "rentals": [{"rentalId": "rental-1", "endDate": None, "gpus": [0], "endedAt": None}],
        }
    }
    server = _StatusServer(str(path), _StatusHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _host_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No GPUHOST_* variable of the machine running the tests, one planted; no engine."""
    for name in list(os.environ):
        if name.startswith("GPUHOST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GPUHOST_RELAY_KEY", ENV_KEY)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    yield
    logs.configure("warning", json_lines=True)  # the command set its own; back to conftest's


def _host(root: Path) -> tuple[Path, Places]:
    """The config file, and the places of the unit, drop-ins and journal, under `root`."""
    state = root / "state"
    (state / "stacks" / "stack-1").mkdir(parents=True)
    (state / "stacks" / "stack-1" / ".env").write_text(f"TOKEN={RENTER_VALUE}\n")
    (state / "stacks" / "stack-1" / "docker-compose.yml").write_text(f"services: {{web: {{image: {RENTER_VALUE}}}}}\n")
    (state / support_bundle.LOCAL_MARKETPLACE_FILE).write_text(json.dumps({"envId": "env-1", **MARKET_KEYS}))
    (root / "api-key").write_text(API_KEY + "\n")
    conf = root / "agent.conf"
    conf.write_text(
        f"GPUHOST_MARKETPLACE_URL=https://market.example.invalid/v1\nGPUHOST_ENV_ID=env-1\n"
        f"GPUHOST_API_KEY_FILE={root / 'api-key'}\nGPUHOST_SWARM_KEY={SWARM_KEY}\n"
        f"GPUHOST_LOCAL_API_KEY={LOCAL_KEY}\nGPUHOST_STATE_DIR={state}\n"
    )
    system = root / "etc" / "systemd" / "system"
    (system / "gpuhost-agent.service.d").mkdir(parents=True)
    (system / "docker.service.d").mkdir()
    shutil.copy(UNIT, system / "gpuhost-agent.service")
    (system / "gpuhost-agent.service.d" / "20-local.conf").write_text(
        f'[Service]\nEnvironment=GPUHOST_API_KEY={API_KEY}\nEnvironment="GPUHOST_PROXY_TOKEN={UNIT_TOKEN}"\n'
        f"Environment=GPUHOST_API_KEY_FILE={root / 'api-key'}\n"
    )
    (system / "docker.service.d" / "10-gpuhost-egress.conf").write_text(
        "[Service]\nExecStartPre=-/opt/gpuhost-agent/venv/bin/gpuhost-agent egress apply\n"
    )
    journal = root / "journal.jsonl"
    journal.write_text("".join(json.dumps(line) + "\n" for line in JOURNAL_LINES))
    journalctl = root / "bin" / "journalctl"
    journalctl.parent.mkdir()
    journalctl.write_text(f'#!/bin/sh\necho "$@" > {root / "journalctl.args"}\ncat {journal}\n')
    journalctl.chmod(0o755)
    places = Places(
        unit=system / "gpuhost-agent.service",
        unit_drop_ins=system / "gpuhost-agent.service.d",
        docker_drop_in=system / "docker.service.d" / "10-gpuhost-egress.conf",
        journalctl=str(journalctl),
    )
    return conf, places


def _members(archive: Path) -> dict[str, str]:
    """Each member's text by its name inside the bundle's folder."""
    with tarfile.open(archive, "r:gz") as tar:
        found = {}
        for member in tar.getmembers():
            assert member.isfile() and member.mode == 0o600, member.name
            folder, _, name = member.name.partition("/")
            assert folder.startswith("gpuhost-support-") and name, member.name
            handle = tar.extractfile(member)
            assert handle is not None
            found[name] = handle.read().decode()
    return found


def test_the_bundle_holds_no_secret_and_no_renters_data(tmp_path, monkeypatch, status_socket, capsys):
    conf, places = _host(tmp_path)
    monkeypatch.setattr(support_bundle, "PLACES", places)
    output = tmp_path / "bundle.tar.gz"

    argv = ["support-bundle", "--config", str(conf), "--status-socket", str(status_socket), "--since", "2h"]
    assert cli.main([*argv, "--output", str(output)]) == 0

    assert capsys.readouterr().out.strip() == str(output)
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    members = _members(output)
    expected = {"manifest.json", "versions.txt", "agent.lock", "doctor.txt", "probe.json", "status.json"}
    expected |= {"agent-log.txt", "systemd/gpuhost-agent.service", "systemd/gpuhost-agent.service.d/20-local.conf"}
    expected |= {"systemd/docker.service.d/10-gpuhost-egress.conf"}
    assert set(members) == expected
    for name, text in members.items():
        for planted in SECRETS + RENTERS:
            assert planted not in text, (name, planted.split("-planted-")[0])
        assert "stacks/" not in name
    with tarfile.open(output, "r:gz") as tar:  # the raw bytes too, names included
        raw = b"".join(tar.extractfile(m).read() + m.name.encode() for m in tar.getmembers())  # type: ignore[union-attr]
    assert not [planted for planted in SECRETS + RENTERS if planted.encode() in raw]

    manifest = json.loads(members["manifest.json"])
    assert {entry["name"] for entry in manifest["files"]} == expected
    assert [entry["name"] for entry in manifest["notGathered"]] == ["engine.json"]  # no engine: said why
    assert "Docker Engine unreachable" in manifest["notGathered"][0]["why"]
    assert manifest["since"] == "2h"
    # What is kept is still there, scrubbed: the log's events, the stacks' ids and states, the unit's paths.
    log = [json.loads(line) for line in members["agent-log.txt"].splitlines()]
    assert [line["event"] for line in log] == [line["event"] for line in JOURNAL_LINES]
    assert log[1]["error"] == "401 for key ***" and "X-API-Key: ***" in log[3]["line"]
    assert "BEGIN OPENSSH PRIVATE KEY" in log[6]["line"]
    args = (tmp_path / "journalctl.args").read_text().split()
    assert args[:2] == ["-u", "gpuhost-agent"] and args[args.index("-o") + 1] == "cat"
    status = json.loads(members["status.json"])
    assert status["stacks"] == [
        {"stackId": "stack-1", "rentalId": "rental-1", "status": "ERROR", "updatedAt": "2026-12-01T00:00:00Z"}
    ]
    assert status["lastError"]["error"] == "rejected ***"
    assert f"GPUHOST_API_KEY_FILE={tmp_path / 'api-key'}" in members["systemd/gpuhost-agent.service.d/20-local.conf"]
    assert members["systemd/gpuhost-agent.service"] == UNIT.read_text()
    assert re.search(r"\n  GPUHOST_SWARM_KEY +\*\*\*  \(file\)\n", members["doctor.txt"])
    assert json.loads(members["probe.json"])["systemData"]["agentVersion"]
    assert members["versions.txt"].startswith("agent: ")


def test_a_bundle_on_a_bare_host_says_what_it_could_not_gather(tmp_path, monkeypatch, capsys):
    """No unit, no journalctl, no agent running, no engine: the bundle is
    written all the same, in the current directory, and says why each is missing."""
    nowhere = tmp_path / "nothing"
    places = Places(nowhere / "a.service", nowhere / "a.service.d", nowhere / "d" / "e.conf", "no-such-journalctl")
    monkeypatch.setattr(support_bundle, "PLACES", places)
    monkeypatch.chdir(tmp_path)

    assert cli.main(["support-bundle", "--state-dir", str(tmp_path / "state")]) == 0

    written = capsys.readouterr().out.strip()
    assert written.startswith("gpuhost-support-") and written.endswith(".tar.gz") and "/" not in written
    assert stat.S_IMODE((tmp_path / written).stat().st_mode) == 0o600
    members = _members(tmp_path / written)
    assert set(members) == {"manifest.json", "versions.txt", "agent.lock", "doctor.txt", "probe.json"}
    missing = {entry["name"]: entry["why"] for entry in json.loads(members["manifest.json"])["notGathered"]}
    assert "not running" in missing["status.json"]
    assert "journalctl is not on this machine" in missing["agent-log.txt"]
    assert "Docker Engine unreachable" in missing["engine.json"]
    assert {"systemd/a.service", "systemd/a.service.d/", "systemd/d/e.conf"} <= set(missing)

    # A file already there is never overwritten; a --since that says nothing is refused.
    assert cli.main(["support-bundle", "--state-dir", str(tmp_path / "state"), "--output", written]) == 1
    assert cli.main(["support-bundle", "--state-dir", str(tmp_path / "state"), "--since", "yesterday"]) == 2


def test_the_engine_and_status_keep_no_container_and_no_renters_words():
    info = {
        "ServerVersion": "27.3.1",
        "Name": "host-1",
        "Labels": ["owner=someone"],
        "Runtimes": {"runc": {"path": "runc"}, "nvidia": {"path": "/usr/bin/nvidia-container-runtime"}},
        "Swarm": {"LocalNodeState": "inactive", "NodeID": "", "RemoteManagers": None, "Cluster": {"Spec": {}}},
        "HttpsProxy": f"http://user:{URL_PASSWORD}@proxy.example:3128",
        "Version": {"Version": "27.3.1", "Components": [{"Name": "Engine", "Version": "27.3.1", "Details": {}}]},
    }
    shown = engine_shown(info)
    assert shown["Runtimes"] == ["nvidia", "runc"] and shown["Swarm"] == {"LocalNodeState": "inactive"}
    assert "Labels" not in shown and "Name" not in shown
    assert shown["Version"]["Components"] == [{"Name": "Engine", "Version": "27.3.1"}]
    assert URL_PASSWORD not in scrub(json.dumps(shown), support_bundle.SecretRegistry())
    assert status_shown({"running": True, "stacks": [{"stackId": "s", "name": RENTER_NAME, "status": "APPLIED"}]}) == {
        "running": True,
        "stacks": [{"stackId": "s", "rentalId": None, "status": "APPLIED", "updatedAt": None}],
    }


def test_the_archive_scrubs_every_member_it_is_given():
    """archive() is the one place files are written: whatever a gatherer hands it is scrubbed."""
    registry = support_bundle.SecretRegistry()
    registry.add(API_KEY)
    bundle = support_bundle.Bundle()
    bundle.add("a.txt", "a file", f"key {API_KEY}\n")
    bundle.lack("b.txt", "not here")
    data = support_bundle.archive(bundle, registry, "gpuhost-support-x", {"note": API_KEY}, 0)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        texts = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert texts["gpuhost-support-x/a.txt"] == "key ***\n"
    assert API_KEY not in texts["gpuhost-support-x/manifest.json"]

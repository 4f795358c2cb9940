"""`gpuhost-agent status` on a host with a real stack: the
stack by its name and rental, the compliance verdict of the agent's own
probe, and the stack's tunnels as the marketplace opens them, with the
connection a renter holds through one of them."""

from __future__ import annotations

import asyncio
import io
import shutil
import tempfile
from pathlib import Path

import pytest
from support.ssh_clients import Endpoint, registered_key, ssh_ready
from support.stacks import SLEEPER, TEST_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import ssh_login, wire
from gpuhost_agent.service.status import cli as status_cli
from gpuhost_agent.service.status.server import StatusSource
from gpuhost_agent.service.wiring import start_status_server

WEB_AND_ECHO = f"""
services:
  web:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /www && echo hello > /www/index.html && exec httpd -f -p 8080 -h /www"]
    expose: ["8080"]
    stop_grace_period: 1s
  echo:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "exec nc -ll -p 9000 -e cat"]
    expose: ["9000"]
    stop_grace_period: 1s
"""


@pytest.fixture
def socket_dir():
    """Unix socket paths must stay under 108 bytes; pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="gh-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _echo_connections(parts, stack_id: str) -> int:
    entry = next(s for s in StatusSource(parts).status()["stacks"] if s["stackId"] == stack_id)
    return next(t["connections"] for t in entry["tunnels"] if t["port"] == 9000)


async def test_status_shows_names_tunnels_and_the_verdict(local_market, socket_dir):
    renter, parts, _local = local_market
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, WEB_AND_ECHO, name="Status Check UI", isSSHEnabled=True)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    await renter.tunnels(rental_id, stack_id, 2, keep=lambda t: t["protocol"] != "ssh")
    # Connect once the tunnel says ready (nc listens): a renter's connection before that met a closed port
    (echo,) = await renter.tunnels(
        rental_id, stack_id, 1, lambda t: t["containerPort"] == 9000 and t["status"] == "ready"
    )

    sock = socket_dir / "agent.sock"
    server = await start_status_server(parts, sock)
    reader, writer = await asyncio.open_connection("127.0.0.1", echo["port"])  # a renter's connection, held
    try:
        writer.write(b"ping\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.readline(), 10) == b"ping\n"  # its tunnel stream is open

        status = await asyncio.to_thread(status_cli.fetch_status, sock)
        entry = next(s for s in status["stacks"] if s["stackId"] == stack_id)
        assert (entry["name"], entry["rentalId"], entry["status"]) == ("Status Check UI", rental_id, wire.APPLIED)
        tunnels = {(t["service"], t["port"], t["protocol"]): t for t in entry["tunnels"]}
        assert {key: (t["open"], t["connections"]) for key, t in tunnels.items()} == {
            ("web", 8080, "tcp"): (True, 0),
            ("echo", 9000, "tcp"): (True, 1),
            (None, None, "ssh"): (True, 0),
        }
        echo_entry = tunnels[("echo", 9000, "tcp")]
        assert echo_entry["containerId"] == echo["containerId"]  # the container the marketplace tunnels to
        assert tunnels[(None, None, "ssh")]["logins"] == sorted(
            ssh_login.ssh_login_name(service, stack_id) for service in ("echo", "web")
        )
        verdict = status["compliance"]  # the agent's own probe of this machine, whatever it found
        assert isinstance(verdict["isCompliant"], bool) and verdict["checks"]

        out = io.StringIO()
        assert await asyncio.to_thread(status_cli.run, sock, False, out=out) == 0
        text = out.getvalue()
        assert f'  {stack_id} "Status Check UI" rental {rental_id} APPLIED, updated ' in text
        assert "  compliance:      " + ("compliant (" if verdict["isCompliant"] else "NOT compliant: ") in text
        rows = [line.split() for line in text.splitlines()]
        assert ["echo", f"({echo_entry['container']})", "9000/tcp", "open", "1", "connection"] in rows
    finally:
        writer.close()
        await server.stop()
    await until(lambda: _echo_connections(parts, stack_id) == 0, timeout=10)  # the stream ended with the connection


def _ssh_row(parts, stack_id: str) -> dict:
    entry = next(s for s in StatusSource(parts).status()["stacks"] if s["stackId"] == stack_id)
    return next(t for t in entry["tunnels"] or [] if t["protocol"] == "ssh")


async def test_an_ssh_login_counts_under_the_stack_its_name_picked(local_market, tmp_path):
    """Two SSH-enabled stacks of one rental share its SSH endpoint; a real `ssh`
    logged in to one of them counts there, not under the other."""
    renter, parts, _local = local_market
    key = tmp_path / "renter"
    await registered_key(renter, key)
    rental_id = await renter.rental()
    stacks = []
    for name in ("Picked", "Other"):
        stack_id = await renter.stack(rental_id, SLEEPER, name=name, isSSHEnabled=True)
        stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
        assert stack["status"] == wire.APPLIED, stack["errorMsg"]
        stacks.append(stack_id)
    picked, other = stacks
    (tunnel,) = await renter.tunnels(rental_id, picked, 1, ssh_ready, timeout=30)
    info = tunnel["ssh"]
    end = await asyncio.to_thread(Endpoint, info["host"], info["port"], info["hostKey"], tmp_path)
    command = ["ssh", *end.options(key), "-p", str(end.port), f"{info['user']}@{end.host}", "sleep", "30"]
    held = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.DEVNULL)
    try:
        await until(lambda: _ssh_row(parts, picked)["connections"] == 1, timeout=20)
        assert (_ssh_row(parts, other)["connections"], _ssh_row(parts, other)["loggingIn"]) == (0, 0)
        assert _ssh_row(parts, picked)["loggingIn"] == 0
    finally:
        held.kill()
        await held.wait()
    await until(lambda: _ssh_row(parts, picked)["connections"] == 0, timeout=10)

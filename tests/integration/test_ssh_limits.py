"""SSH channels are capped per connection and per rental,
end to end: OpenSSH's own client multiplexing sessions over one connection
(ControlMaster) and holding many `ssh -L` connections through one login, and
asyncssh as a client for the bulk of a rental's cap. A channel past a cap is
refused at its opening with the reason; one rental at its cap leaves another
its sessions and forwards; a channel that closes gives its place back."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import asyncssh
import pytest
from support.ssh_clients import Endpoint, free_port, make_key, ssh_stack
from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import wire
from gpuhost_agent.streams.exec_rate import ExecRate
from gpuhost_agent.streams.ssh.channels import ChannelCaps

CAPS = ChannelCaps()
STACK = f"""
services:
  shell:
    image: {TEST_IMAGE}
    command: ["sleep", "100000"]
    stop_grace_period: 1s
  web:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /www && echo hello over ssh -L > /www/index.html && exec httpd -f -p 8080 -h /www"]
    expose: ["8080"]
    stop_grace_period: 1s
"""
GET = b"GET / HTTP/1.0\r\n\r\n"


@pytest.fixture
def short_dir():
    """A ControlPath must stay under 108 bytes; pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="gh-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _endpoint(renter, key_public: str, workdir: Path) -> tuple[Endpoint, str]:
    """A new rental with an SSH-enabled stack; its `shell` endpoint and login name."""
    _stack_id, ssh = await ssh_stack(renter, key_public, STACK, 2, "ssh")
    info = ssh["shell"]
    await asyncio.to_thread(workdir.mkdir, exist_ok=True)
    end = await asyncio.to_thread(Endpoint, info["host"], info["port"], info["hostKey"], workdir)
    return end, info["user"]


def _in_thread(check):
    """A blocking check off the loop: the agent and the marketplace run on it."""
    return asyncio.to_thread(check)


def _run(*command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, timeout=timeout)


def _multiplexed(mux: list[str]) -> bool:
    done = _run(*mux, "echo again")
    return done.stdout == b"again\n" and b"refused" not in done.stderr


def _start_session(args: list[str]) -> subprocess.Popen:
    """A multiplexed `ssh ... 'echo up; exec sleep'`, once its command runs."""
    process = subprocess.Popen([*args, "echo up; exec sleep 300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"up\n", process.stderr
    return process


async def test_sessions_per_connection_with_openssh_multiplexing(local_market, tmp_path, short_dir):
    renter, _parts, _local = local_market
    key = tmp_path / "renter"
    end, user = await _endpoint(renter, await asyncio.to_thread(make_key, key), tmp_path / "a")
    control, log = short_dir / "ctl", tmp_path / "master.log"
    mux = ["ssh", *end.options(key), "-S", str(control), "-p", str(end.port), f"{user}@{end.host}"]
    master = await asyncio.to_thread(
        _logged,
        ["ssh", *end.options(key), "-M", "-S", str(control), "-N", "-p", str(end.port), f"{user}@{end.host}"],
        log,
    )
    sessions: list[subprocess.Popen] = []
    try:
        await until(lambda: _in_thread(lambda: _run(*mux[:-1], "-O", "check", mux[-1]).returncode == 0), timeout=20)
        for _ in range(CAPS.sessions_per_connection):
            sessions.append(await asyncio.to_thread(_start_session, mux))

        # The eleventh is refused at its opening, the reason on the master's terminal; OpenSSH's
        # mux client then falls back to a connection of its own, which has its own sessions
        refused = await asyncio.to_thread(_run, *mux, "echo on a new connection")
        assert b"Session open refused by peer" in refused.stderr, refused
        assert refused.stdout == b"on a new connection\n", refused
        said = await asyncio.to_thread(log.read_text)
        assert f"administratively prohibited: at most {CAPS.sessions_per_connection} sessions" in said, said
        assert "per SSH connection" in said

        # A session that ends gives its place back: the next one runs over the master's connection
        sessions.pop().terminate()
        await until(lambda: _in_thread(lambda: _multiplexed(mux)), timeout=20)
    finally:
        for process in sessions:
            process.terminate()
        await asyncio.to_thread(_run, *mux[:-1], "-O", "exit", mux[-1])
        master.terminate()
        await asyncio.to_thread(master.wait, 10)


def _held(port: int, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.setblocking(False)
        held.append(sock)
    return held


def _logged(command: list[str], log: Path) -> subprocess.Popen:
    with log.open("wb") as err:
        return subprocess.Popen(command, stderr=err)


def _count_closed(held: list[socket.socket]) -> int:
    return sum(map(_closed, held))


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


async def test_forwards_per_connection_with_openssh(local_market, tmp_path):
    renter, _parts, _local = local_market
    key = tmp_path / "renter"
    end, user = await _endpoint(renter, await asyncio.to_thread(make_key, key), tmp_path / "a")
    port, log = free_port(), tmp_path / "forward.log"
    forward = await asyncio.to_thread(
        _logged,
        ["ssh", *end.options(key), "-p", str(end.port), "-N", "-L", f"127.0.0.1:{port}:web:8080", f"{user}@{end.host}"],
        log,
    )
    held: list[socket.socket] = []
    try:
        await until(lambda: _in_thread(lambda: _fetch(port).endswith(b"hello over ssh -L\n")), timeout=20)
        extra = 6
        held = await asyncio.to_thread(_held, port, CAPS.forwards_per_connection + extra)
        await until(lambda: _in_thread(lambda: _count_closed(held) == extra), timeout=20)  # ssh closes the refused
        await asyncio.sleep(1)
        assert await asyncio.to_thread(_count_closed, held) == extra  # and every other one stays open
        said = await asyncio.to_thread(log.read_text)
        prohibited = f"open failed: administratively prohibited: at most {CAPS.forwards_per_connection} ssh -L"
        assert said.count(prohibited) == extra, said

        next(sock for sock in held if not _closed(sock)).close()  # one ends: its place is given back
        await until(lambda: _in_thread(lambda: _fetch(port).endswith(b"hello over ssh -L\n")), timeout=20)
    finally:
        for sock in held:
            sock.close()
        forward.terminate()
        await asyncio.to_thread(forward.wait, 10)


def _fetch(port: int) -> bytes:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(GET)
            sock.settimeout(5)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)
    except OSError:
        return b""


async def _connect(end: Endpoint, key: Path, user: str) -> asyncssh.SSHClientConnection:
    return await asyncssh.connect(
        end.host, end.port, username=user, client_keys=[str(key)], known_hosts=str(end.known_hosts)
    )


async def _refusal(opening) -> asyncssh.ChannelOpenError:
    with pytest.raises(asyncssh.ChannelOpenError) as refused:
        await opening
    assert refused.value.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED
    return refused.value


async def test_a_rental_at_its_caps_leaves_another_rental_its_channels(local_market, tmp_path):
    renter, _parts, _local = local_market
    key = tmp_path / "renter"
    public = await asyncio.to_thread(make_key, key)
    first, first_user = await _endpoint(renter, public, tmp_path / "a")
    second, second_user = await _endpoint(renter, public, tmp_path / "b")
    connections = [await _connect(first, key, first_user) for _ in range(5)]
    try:
        # Sessions: the rental's cap over several connections, each under its own
        per = CAPS.sessions_per_connection
        for number in range(CAPS.sessions_per_rental):
            await connections[number // per].create_process("exec sleep 300")
        last = connections[CAPS.sessions_per_rental // per]
        refused = await _refusal(last.create_process("echo one-too-many"))
        assert f"this rental has {CAPS.sessions_per_rental} sessions" in refused.reason, refused.reason

        # Forwards: the same
        per = CAPS.forwards_per_connection
        streams = []
        for number in range(CAPS.forwards_per_rental):
            streams.append(await connections[number // per].open_connection("web", 8080))
        refused = await _refusal(connections[-1].open_connection("web", 8080))
        assert f"this rental has {CAPS.forwards_per_rental} ssh -L connections" in refused.reason, refused.reason

        # The other rental, with OpenSSH: a session and a forward
        done = await asyncio.to_thread(second.ssh, key, second_user, "echo second rental")
        assert done.stdout == b"second rental\n", done
        done = await asyncio.to_thread(second.ssh, key, second_user, options=("-W", "web:8080"), stdin=GET)
        assert done.stdout.endswith(b"hello over ssh -L\n"), done

        # The first rental's connections end: its places are given back
        for conn in connections[:-1]:
            conn.close()
            await conn.wait_closed()
        await until(lambda: _reachable(connections[-1]), timeout=20)
    finally:
        for conn in connections:
            conn.close()
            with contextlib.suppress(Exception):
                await conn.wait_closed()


async def _reachable(conn: asyncssh.SSHClientConnection) -> bool:
    try:
        done = await conn.run("echo back", timeout=10)
    except asyncssh.ChannelOpenError:
        return False
    return done.stdout == "back\n"


async def test_a_loop_of_sessions_starts_execs_at_the_rentals_rate(local_market, tmp_path):
    """Each session is a Docker exec (dockerd, containerd and runc work outside the
    rental's share): a loop of open-and-close sessions was never refused.
    Counted on the engine's own events: the execs it started for the rental."""
    renter, _parts, _local = local_market
    key = tmp_path / "renter"
    public = await asyncio.to_thread(make_key, key)
    stack_id, ssh = await ssh_stack(renter, public, STACK, 2, "ssh")
    info = ssh["shell"]
    end = await asyncio.to_thread(Endpoint, info["host"], info["port"], info["hostKey"], tmp_path)
    user = info["user"]
    since = int(time.time())
    started = time.monotonic()
    conn = await _connect(end, key, user)
    outcomes = []
    try:
        for _ in range(ExecRate().burst + 30):
            outcomes.append(await conn.run("true", timeout=30))
    finally:
        conn.close()
        await conn.wait_closed()
    elapsed = time.monotonic() - started
    ran = [done for done in outcomes if done.exit_status == 0]
    refused = [done for done in outcomes if done.exit_status != 0]
    assert refused and all("too many sessions started" in str(done.stderr) for done in refused), refused[:1]
    assert len(ran) <= ExecRate().burst + ExecRate().per_second * elapsed + 1, (len(ran), elapsed)
    events = await asyncio.to_thread(
        _run, "docker", "events", "--since", str(since), "--until", str(int(time.time()) + 1),
        "--filter", "event=exec_create", "--filter", f"label={wire.LABEL_STACK}={stack_id}",
        "--format", "{{.Actor.ID}}",
    )  # fmt: skip
    assert len(events.stdout.split()) == len(ran), "an exec for every session run, none for a refused one"

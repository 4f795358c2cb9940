"""runtime/netns_dial.py without containers: a socket made inside a network
namespace, here a fresh one made with `unshare --net` (its own loopback,
where a server listens that this process's namespace cannot reach), and
the errors a caller sees. The server is put in a cgroup named like a
container's (/sys/fs/cgroup/pids/...-<id>) and dialled as that container;
asked as another container, or not in a container at all, it is refused
before the switch. The same code dials Swarm
containers in tests/integration/test_door_engine.py and
test_swarm_worker_engine.py."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

import pytest

from gpuhost_agent.runtime.netns_dial import NetnsError, dial_in_namespace

SERVER = (
    "import socket, sys; s=socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET); "
    "s.bind((sys.argv[1], 47001)); s.listen(); print('up', flush=True); "
    "c, _ = s.accept(); c.sendall(b'from-inside:' + c.recv(100)); c.close()"
)
HIERARCHY = Path("/sys/fs/cgroup/pids")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (HIERARCHY / "cgroup.procs").exists(),
    reason="entering a network namespace needs root; a container's cgroup, a cgroup v1 pids hierarchy",
)


def _enter(group: Path, pid: int) -> None:
    group.mkdir()
    (group / "cgroup.procs").write_text(str(pid))


async def _server(
    container_id: str | None, address: str = "127.0.0.1", own_namespace: bool = True
) -> tuple[asyncio.subprocess.Process, Path | None]:
    if own_namespace:
        command = ("unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" -c "$1" "$2"')
    else:  # in the host's (this process's) own namespace, as a container with network_mode host would be
        command = ("sh", "-c", 'exec "$0" -c "$1" "$2"')
    server = await asyncio.create_subprocess_exec(
        *command, sys.executable, SERVER, address, stdout=asyncio.subprocess.PIPE
    )
    group = None
    if container_id:
        group = HIERARCHY / f"gpuhost-test-{container_id}"
        await asyncio.to_thread(_enter, group, server.pid)
    assert server.stdout is not None
    assert (await asyncio.wait_for(server.stdout.readline(), 10)).strip() == b"up"
    return server, group


async def _end(server: asyncio.subprocess.Process, group: Path | None) -> None:
    if server.returncode is None:
        server.kill()
    await server.wait()
    if group is not None:
        await asyncio.to_thread(group.rmdir)


async def test_a_connection_is_made_inside_the_containers_namespace_and_only_there() -> None:
    container_id = uuid.uuid4().hex * 2
    server, group = await _server(container_id)
    try:
        with pytest.raises(ConnectionRefusedError):  # this process's own loopback has no such server
            await asyncio.open_connection("127.0.0.1", 47001)
        reader, writer = await dial_in_namespace(server.pid, "127.0.0.1", 47001, 5, container_id=container_id)
        writer.write(b"hello")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b"from-inside:hello"
        writer.close()
    finally:
        await _end(server, group)


async def test_ipv6_loopback_inside_the_namespace() -> None:
    container_id = uuid.uuid4().hex * 2
    server, group = await _server(container_id, "::1")
    try:
        reader, writer = await dial_in_namespace(server.pid, "::1", 47001, 5, container_id=container_id)
        writer.write(b"six")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b"from-inside:six"
        writer.close()
    finally:
        await _end(server, group)


async def test_a_container_in_the_hosts_own_namespace_is_never_dialled() -> None:
    """An SSH `-L localhost:PORT` dials the container's loopback in its
    namespace: one that is the host's would be the host's loopback."""
    container_id = uuid.uuid4().hex * 2
    server, group = await _server(container_id, own_namespace=False)
    try:
        with pytest.raises(NetnsError, match="shares the host's network"):
            await dial_in_namespace(server.pid, "127.0.0.1", 47001, 5, container_id=container_id)
        reader, writer = await asyncio.open_connection("127.0.0.1", 47001)  # it was there, on the host
        writer.close()
    finally:
        await _end(server, group)


async def test_a_pid_that_is_not_the_containers_is_refused_before_the_switch() -> None:
    server, group = await _server(uuid.uuid4().hex * 2)
    try:
        with pytest.raises(NetnsError, match="not the container's"):  # another container's process
            await dial_in_namespace(server.pid, "127.0.0.1", 47001, 5, container_id=uuid.uuid4().hex * 2)
    finally:
        await _end(server, group)
    server, group = await _server(None)
    try:
        for asked in (uuid.uuid4().hex * 2, ""):  # a host process: refused, with or without an id
            with pytest.raises(NetnsError, match="not the container's"):
                await dial_in_namespace(server.pid, "127.0.0.1", 47001, 5, container_id=asked)
    finally:
        await _end(server, group)


async def test_no_process_or_a_gone_one_is_an_error_saying_so() -> None:
    with pytest.raises(NetnsError, match="not running"):
        await dial_in_namespace(0, "127.0.0.1", 80, timeout=1)
    with pytest.raises(NetnsError, match="gone"):
        await dial_in_namespace(4_000_000, "127.0.0.1", 80, timeout=1, container_id="a" * 64)  # above pid_max

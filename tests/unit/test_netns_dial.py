"""runtime/netns_dial.py without containers: a socket made inside a network
namespace, here a fresh one made with `unshare --net` (its own loopback,
where a server listens that this process's namespace cannot reach), and
the errors a caller sees. The same code dials Swarm containers in
tests/integration/test_node_proxy_engine.py and test_swarm_worker_engine.py."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from gpuhost_agent.runtime.netns_dial import NetnsError, dial_in_namespace

SERVER = (
    "import socket; s=socket.socket(); s.bind(('127.0.0.1', 47001)); s.listen(); print('up', flush=True); "
    "c, _ = s.accept(); c.sendall(b'from-inside:' + c.recv(100)); c.close()"
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="entering a network namespace needs root")


async def test_a_connection_is_made_inside_the_other_namespace_and_only_there() -> None:
    server = await asyncio.create_subprocess_exec(
        *("unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" -c "$1"', sys.executable, SERVER),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        assert (await asyncio.wait_for(server.stdout.readline(), 10)).strip() == b"up"
        with pytest.raises(ConnectionRefusedError):  # this process's own loopback has no such server
            await asyncio.open_connection("127.0.0.1", 47001)
        reader, writer = await dial_in_namespace(server.pid, "127.0.0.1", 47001, timeout=5)
        writer.write(b"hello")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b"from-inside:hello"
        writer.close()
    finally:
        if server.returncode is None:
            server.kill()
        await server.wait()


async def test_no_process_or_a_gone_one_is_an_error_saying_so() -> None:
    with pytest.raises(NetnsError, match="not running"):
        await dial_in_namespace(0, "127.0.0.1", 80, timeout=1)
    with pytest.raises(FileNotFoundError):
        await dial_in_namespace(4_000_000, "127.0.0.1", 80, timeout=1)  # above pid_max: no such process

"""`ssh -L 8888:localhost:8888` and `ssh -D`, end to end with OpenSSH.

In a login to a container, `localhost`, 127.0.0.1 and ::1 are that
container's own loopback, on any port, dialled inside its network namespace:
what Jupyter (`--ip=localhost`), TensorBoard and VS Code Remote-SSH's server
listen on. `-D` (SOCKS, VS Code's default) opens the same channels. Other
containers of the stack stay reachable by service name on their declared
ports; nothing else is: not a service on the host's own loopback, not another
stack's container. The VS Code test replays what Remote-SSH does: a script
over `ssh -T -D ... <shell>` starts the server on a random loopback port of
the remote and prints it, then a connection through the SOCKS proxy (and,
without a local server, through `ssh -L`) reaches it. The offline busybox
image has no bash, so its `sh` reads the script, and `httpd` stands in for
VS Code's server.
"""

from __future__ import annotations

import asyncio
import re
import subprocess

from support.ssh_clients import Endpoint, free_port, make_key, ssh_stack
from support.stacks import TEST_IMAGE

from gpuhost_agent.protocol import wire

STACK = f"""
services:
  box:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /nb && echo notebook > /nb/index.html && exec httpd -f -p 127.0.0.1:8888 -h /nb"]
    stop_grace_period: 1s
  web:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /www && echo sibling > /www/index.html && exec httpd -f -p 8080 -h /www"]
    expose: ["8080"]
    stop_grace_period: 1s
"""
OTHER = f"""
services:
  other:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /www && echo another stack > /www/index.html && exec httpd -f -p 8888 -h /www"]
    expose: ["8888"]
    stop_grace_period: 1s
"""
# What VS Code Remote-SSH writes into the remote shell, in short: start the
# server on a free loopback port, print the port, then stay while the
# connection is open (its script waits; here `cat` waits for stdin's end).
VSCODE_SCRIPT = b"""
PORT=$((20000 + RANDOM % 20000))
mkdir -p /tmp/vscode && echo vscode server stand-in > /tmp/vscode/index.html
httpd -p 127.0.0.1:$PORT -h /tmp/vscode
echo "listeningOn==$PORT=="
cat
"""


def _curl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sS", "--max-time", "5", *args], capture_output=True, timeout=15)


async def _until_served(*args: str) -> subprocess.CompletedProcess:
    """curl until the forward is up (ssh opens its listener after the login)."""
    for _ in range(60):
        done = await asyncio.to_thread(_curl, *args)
        if done.returncode == 0:
            return done
        await asyncio.sleep(0.25)
    return done


class _Forward:
    """`ssh -N` with forwards, for as long as the `async with` lasts."""

    def __init__(self, end: Endpoint, key, user: str, *forwards: str):
        self.command = ["ssh", *end.options(key), "-o", "ExitOnForwardFailure=yes", "-N", *forwards]
        self.command += ["-p", str(end.port), f"{user}@{end.host}"]

    async def __aenter__(self) -> _Forward:
        self.process = await asyncio.to_thread(subprocess.Popen, self.command, stderr=subprocess.PIPE)
        return self

    async def __aexit__(self, *_: object) -> None:
        self.process.terminate()
        await asyncio.to_thread(self.process.wait, 10)


async def _host_service() -> tuple[asyncio.Server, int]:
    """A service on the host's own loopback, which no renter may reach."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nthe host's own loopback\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_localhost_is_the_containers_own_loopback_and_nothing_else(local_market, docker_client, tmp_path):
    renter, _parts, _local = local_market
    key = tmp_path / "renter"
    public = await asyncio.to_thread(make_key, key)
    _other_stack, _ = await ssh_stack(renter, public, OTHER, 1, "loopback")
    (other,) = await asyncio.to_thread(
        docker_client.containers.list, filters={"label": f"{wire.LABEL_STACK}={_other_stack}"}
    )
    other_address = next(iter(other.attrs["NetworkSettings"]["Networks"].values()))["IPAddress"]
    _stack_id, ssh = await ssh_stack(renter, public, STACK, 2, "loopback")
    info = ssh["box"]
    end = await asyncio.to_thread(Endpoint, info["host"], info["port"], info["hostKey"], tmp_path)
    user = info["user"]

    # The host's own loopback: served on the host, and out of reach through localhost, 127.0.0.1 or ::1
    socks = free_port()
    proxy = ("--socks5-hostname", f"127.0.0.1:{socks}")
    async with _Forward(end, key, user, "-D", f"127.0.0.1:{socks}"):
        assert (await _until_served(*proxy, "http://web:8080/")).stdout == b"sibling\n"  # the proxy is up
        server, host_port = await _host_service()
        try:
            done = await asyncio.to_thread(_curl, f"http://127.0.0.1:{host_port}/")
            assert done.stdout == b"the host's own loopback\n", done  # it does answer, on the host
            for target in (f"localhost:{host_port}", f"127.0.0.1:{host_port}", f"[::1]:{host_port}"):
                done = await asyncio.to_thread(_curl, *proxy, f"http://{target}/")
                assert done.returncode != 0 and b"host" not in done.stdout, (target, done)
                done = await asyncio.to_thread(end.ssh, key, user, options=("-W", target))
                assert done.returncode != 0 and b"open failed" in done.stderr, (target, done)
                assert b"loopback" in done.stderr, done  # the reason is said: nothing listens there
        finally:
            server.close()

    # Jupyter's pasted command: -L to localhost, and to 127.0.0.1, of the container logged in to
    port, literal = free_port(), free_port()
    async with _Forward(end, key, user, "-L", f"127.0.0.1:{port}:localhost:8888", "-L", f"{literal}:127.0.0.1:8888"):
        done = await _until_served(f"http://127.0.0.1:{port}/")
        assert done.stdout == b"notebook\n", done
        done = await _until_served(f"http://127.0.0.1:{literal}/")
        assert done.stdout == b"notebook\n", done

    # -D: SOCKS with the name resolved at the far end, to the loopback and to a sibling by service name
    async with _Forward(end, key, user, "-D", f"127.0.0.1:{socks}"):
        done = await _until_served(*proxy, "http://localhost:8888/")
        assert done.stdout == b"notebook\n", done
        done = await asyncio.to_thread(_curl, *proxy, "http://web:8080/")
        assert done.stdout == b"sibling\n", done
        for outside in ("http://web:9999/", f"http://{other.name}:8888/", f"http://{other_address}:8888/"):
            done = await asyncio.to_thread(_curl, *proxy, outside)
            assert done.returncode != 0 and b"another stack" not in done.stdout, (outside, done)

    # Another stack's container, by its name, its address or its service name: refused
    for target in (f"{other.name}:8888", f"{other_address}:8888", "other:8888"):
        done = await asyncio.to_thread(end.ssh, key, user, options=("-W", target))
        assert done.returncode != 0 and b"open failed" in done.stderr, (target, done)


async def test_vscode_remote_ssh_sequence(local_market, tmp_path):
    """Remote-SSH's own steps: `ssh -T -D <port> host <shell>` with its script
    on stdin, the port read from `listeningOn==PORT==`, then the server
    reached through the SOCKS proxy at 127.0.0.1:PORT, or through `ssh -L`."""
    renter, _parts, _local = local_market
    key = tmp_path / "renter"
    _stack_id, ssh = await ssh_stack(renter, await asyncio.to_thread(make_key, key), STACK, 2, "loopback")
    info = ssh["box"]
    end = await asyncio.to_thread(Endpoint, info["host"], info["port"], info["hostKey"], tmp_path)
    socks = free_port()
    command = ["ssh", *end.options(key), "-T", "-D", f"127.0.0.1:{socks}", "-p", str(end.port)]
    remote = await asyncio.to_thread(
        subprocess.Popen,
        [*command, f"{info['user']}@{end.host}", "sh"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert remote.stdin is not None and remote.stdout is not None
        await asyncio.to_thread(remote.stdin.write, VSCODE_SCRIPT)
        await asyncio.to_thread(remote.stdin.flush)
        line = await asyncio.wait_for(asyncio.to_thread(remote.stdout.readline), 30)
        found = re.fullmatch(rb"listeningOn==(\d+)==\n", line)
        assert found, line
        server_port = int(found.group(1))

        for host in ("127.0.0.1", "localhost"):
            done = await _until_served("--socks5-hostname", f"127.0.0.1:{socks}", f"http://{host}:{server_port}/")
            assert done.stdout == b"vscode server stand-in\n", done

        local = free_port()
        async with _Forward(end, key, info["user"], "-L", f"127.0.0.1:{local}:127.0.0.1:{server_port}"):
            done = await _until_served(f"http://127.0.0.1:{local}/")
            assert done.stdout == b"vscode server stand-in\n", done
    finally:
        if remote.stdin is not None:  # the end of the script's stdin: its `cat` ends, and the session
            await asyncio.to_thread(remote.stdin.close)
        try:
            await asyncio.to_thread(remote.wait, 15)
        except subprocess.TimeoutExpired:
            remote.kill()
            await asyncio.to_thread(remote.wait, 5)

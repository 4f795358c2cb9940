"""The pull guard (streams/pull_guard.py): dockerd's pulls
go through it, so a registry name that resolves to the host when dockerd
pulls (DNS rebinding), or a registry's redirect to the host, reaches nothing
of the host's.

The client is curl, which speaks to a proxy as dockerd's Go client does
(CONNECT for https, an absolute URL for http). The services it would reach
listen on this machine's every address and count who reached them; the
"internet" is an address outside the host's own, carried by a stand-in
upstream proxy that records what it is asked (nothing leaves the machine).
Only the resolver is a stand-in, where a test needs a name to answer a given
address; every other name is resolved by the system's own resolver.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from gpuhost_agent.core.sandbox.host_network import allows
from gpuhost_agent.streams import pull_guard
from gpuhost_agent.streams.pull_guard import GuardRefused, PullGuard, Target
from gpuhost_agent.streams.tunnel import read_host_networks

BODY = os.urandom(3 * 1024 * 1024 + 17)


async def _host_networks() -> list:
    return await asyncio.to_thread(read_host_networks)


class Service:
    """An HTTP service on every address of the host: who reached it, and what they asked."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(BODY) + BODY)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def _service() -> AsyncIterator[Service]:
    service = Service()
    server = await asyncio.start_server(service._serve, "0.0.0.0", 0)
    service.port = server.sockets[0].getsockname()[1]
    try:
        yield service
    finally:
        server.close()


@asynccontextmanager
async def _guard(guard: PullGuard) -> AsyncIterator[str]:
    server = await guard.serve("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def _curl(*args: str) -> tuple[int, bytes, str]:
    env = {"PATH": os.environ["PATH"]}  # no NO_PROXY or proxy of the caller's
    process = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--max-time", "20", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out, err.decode()


def _names_of_the_host() -> list[str]:
    """Names the system's resolver answers with an address of this machine: localhost, and its host name."""
    names = ["localhost"]
    try:
        socket.getaddrinfo(socket.gethostname(), None)
        names.append(socket.gethostname())
    except OSError:
        pass
    return names


async def test_a_registry_name_that_resolves_to_the_host_is_refused_and_nothing_of_the_host_is_reached() -> None:
    guard = PullGuard(allowed=allows(()), host_networks=_host_networks)
    async with _service() as service, _guard(guard) as proxy:
        for name in [*_names_of_the_host(), "127.1", "[::1]", "0.0.0.0"]:
            for how in (["-p", f"http://{name}:{service.port}/v2/"], [f"https://{name}:{service.port}/v2/"]):
                code, _, err = await _curl("-x", proxy, *how)
                assert code == 56 and "403" in err, (name, how, code, err)  # curl: the proxy refused the CONNECT
            code, out, _ = await _curl("-x", proxy, f"http://{name}:{service.port}/v2/")  # a plain http request
            assert code == 0 and b"the host's engine does not go there" in out, out
    assert service.heads == []  # not one connection reached the host's service
    assert guard.refused >= 3 * 5


async def test_link_local_and_mixed_answers_are_refused_by_the_address_judged() -> None:
    answers = {"rebinding.example": ["203.0.113.7", "127.0.0.1"], "metadata.example": ["169.254.169.254"]}

    async def lookup(host: str, _port: int) -> list[str]:
        return answers[host]

    guard = PullGuard(allowed=allows(()), host_networks=_host_networks, lookup=lookup)
    for host, port, why in (
        ("169.254.169.254", 80, "link-local"),
        ("fe80::1", 443, "link-local"),
        ("rebinding.example", 443, "127.0.0.1, a loopback address"),
        ("metadata.example", 443, "169.254.169.254, link-local"),
        # what a rental's containers may not reach either
        ("172.18.0.2", 5000, "private"),  # the host reaches its bridges: another rental's container
        ("100.100.100.200", 80, "private"),  # Alibaba Cloud's metadata service
        ("168.63.129.16", 32526, "private"),  # Azure's WireServer
        ("fd00:ec2::254", 80, "private"),  # AWS's metadata service over IPv6
    ):
        with pytest.raises(GuardRefused) as refused:
            await guard.address_for(Target(host, port))
        assert refused.value.status == 403 and why in refused.value.reason, refused.value.reason


async def test_a_private_network_the_operator_opened_is_judged_open() -> None:
    import ipaddress

    guard = PullGuard(allows(()), _host_networks, opened=(ipaddress.ip_network("10.0.8.0/24"),))
    assert await guard.address_for(Target("10.0.8.5", 5000)) == "10.0.8.5"
    with pytest.raises(GuardRefused):
        await guard.address_for(Target("10.0.9.5", 5000))


async def test_an_allowed_registry_is_carried_both_ways_byte_for_byte() -> None:
    async with _service() as service:
        guard = PullGuard(allowed=allows([f"127.0.0.1:{service.port}"]), host_networks=_host_networks)
        async with _guard(guard) as proxy:
            code, tunneled, err = await _curl("-p", "-x", proxy, f"http://127.0.0.1:{service.port}/v2/tunneled")
            assert code == 0, err
            code, forwarded, err = await _curl(
                "-x", proxy, "-H", "Proxy-Authorization: Basic c2VjcmV0", f"http://127.0.0.1:{service.port}/v2/plain"
            )
            assert code == 0, err
    assert hashlib.sha256(tunneled).digest() == hashlib.sha256(forwarded).digest() == hashlib.sha256(BODY).digest()
    tunnel_head, plain_head = service.heads
    assert tunnel_head.startswith(b"GET /v2/tunneled HTTP/1.1\r\n")
    # A plain request goes on in origin form, without the proxy's own headers, and ends its connection.
    assert plain_head.startswith(b"GET /v2/plain HTTP/1.1\r\n"), plain_head
    assert b"Proxy-" not in plain_head and plain_head.endswith(b"Connection: close\r\n\r\n"), plain_head
    assert f"Host: 127.0.0.1:{service.port}".encode() in plain_head


class Upstream:
    """An operator's proxy: answers each CONNECT with 200 (or `status`) and then an HTTP answer."""

    def __init__(self, status: bytes = b"200 Connection established") -> None:
        self.asked: list[bytes] = []
        self.status = status

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.asked.append((await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[0])
            writer.write(b"HTTP/1.1 " + self.status + b"\r\n\r\n")
            if self.status.startswith(b"200"):
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nfar away")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def _upstream(upstream: Upstream) -> AsyncIterator[tuple[str, int]]:
    server = await asyncio.start_server(upstream._serve, "127.0.0.1", 0)
    try:
        yield "127.0.0.1", server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_an_operators_proxy_is_asked_for_the_address_judged_never_the_name() -> None:
    """The upstream would resolve a name again (and could get the host): it is given the address the guard judged."""

    async def lookup(host: str, _port: int) -> list[str]:
        return {"registry.example": ["203.0.113.7"]}[host]

    upstream = Upstream()
    async with _upstream(upstream) as address:
        guard = PullGuard(allowed=allows(()), host_networks=_host_networks, upstream=address, lookup=lookup)
        async with _guard(guard) as proxy:
            code, out, err = await _curl("-p", "-x", proxy, "http://registry.example:5000/v2/")
            assert (code, out) == (0, b"far away"), err
            code, out, err = await _curl("-x", proxy, "http://[2001:db8::5]/v2/")
            assert (code, out) == (0, b"far away"), err
    assert upstream.asked == [b"CONNECT 203.0.113.7:5000 HTTP/1.1", b"CONNECT [2001:db8::5]:80 HTTP/1.1"]


async def test_an_upstream_refusal_is_said() -> None:
    upstream = Upstream(b"403 Forbidden by policy")
    async with _upstream(upstream) as address:
        guard = PullGuard(allowed=allows(()), host_networks=_host_networks, upstream=address)
        async with _guard(guard) as proxy:
            code, out, _ = await _curl("-x", proxy, "http://203.0.113.9/v2/")
    assert code == 0 and b"the upstream proxy answered 'HTTP/1.1 403 Forbidden by policy'" in out, out


async def test_an_upstream_that_does_not_answer_is_said() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    guard = PullGuard(allowed=allows(()), host_networks=_host_networks, upstream=("127.0.0.1", port))
    async with _guard(guard) as proxy:
        code, out, _ = await _curl("-x", proxy, "http://203.0.113.9/v2/")
    assert code == 0 and f"the upstream proxy 127.0.0.1:{port} did not answer".encode() in out, out


async def _raw(proxy: str, data: bytes) -> bytes:
    host, port = proxy.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_reads_are_bounded_and_connections_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = PullGuard(allowed=allows(()), host_networks=_host_networks)
    async with _guard(guard) as proxy:
        answer = await _raw(proxy, b"CONNECT x:1 HTTP/1.1\r\n" + b"X: " + b"a" * pull_guard.HEAD_LIMIT + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 431 "), answer
        for bad in (
            b"CONNECT x HTTP/1.1",
            b"GET /v2/ HTTP/1.1",
            b"CONNECT a b:1 HTTP/1.1",
            b"CONNECT x:99999 HTTP/1.1",
        ):
            assert (await _raw(proxy, bad + b"\r\n\r\n")).startswith(b"HTTP/1.1 400 "), bad
        monkeypatch.setattr(pull_guard, "MAX_CONNECTIONS", 2)
        host, port = proxy.removeprefix("http://").split(":")
        held = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
        await _until(lambda: guard.open == 2)
        # Over the cap: closed at the accept, before a byte is read (4000 idle connections
        # were held at once with a cap of 256, each a descriptor of the agent's).
        reader, writer = await asyncio.open_connection(host, int(port))
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        for _, writer in held:
            writer.close()
        await _until(lambda: guard.open == 0)


async def test_the_probe_tells_the_agents_guard_from_a_program_that_took_its_port(tmp_path) -> None:
    """A program that took the guard's port (during a restart) answered the fixed
    probe and passed compliance. The probe's challenge is answered with the agent's root-only key."""
    key_file = tmp_path / "pull-guard.key"
    key = await asyncio.to_thread(pull_guard.new_key, key_file)
    guard = PullGuard(allowed=allows(()), host_networks=_host_networks, key=key)
    assert (await asyncio.to_thread(key_file.stat)).st_mode & 0o777 == 0o600
    async with _guard(guard) as proxy:
        host, port = proxy.removeprefix("http://").split(":")
        assert await pull_guard.answers(host, int(port), key_file) is None

    async def squatter(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 25\r\n\r\n" + pull_guard.PROBE_ANSWER)
        writer.close()

    server = await asyncio.start_server(squatter, "127.0.0.1", 0)
    try:
        said = await pull_guard.answers("127.0.0.1", server.sockets[0].getsockname()[1], key_file)
    finally:
        server.close()
    assert said is not None and "another program's" in said
    assert "nothing answers" in (await pull_guard.answers("127.0.0.1", 9, key_file) or "")


async def test_a_lookup_waits_on_no_thread_of_the_agents_shared_pool() -> None:
    """The guard's lookups ran in the event loop's shared pool, so slow
    resolvers delayed every to_thread of the agent. With that pool all busy, a lookup answers."""
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    busy, release = ThreadPoolExecutor(max_workers=1), asyncio.Event()
    loop.set_default_executor(busy)
    held = loop.run_in_executor(None, lambda: asyncio.run_coroutine_threadsafe(release.wait(), loop).result())
    try:
        assert "127.0.0.1" in await asyncio.wait_for(pull_guard.system_lookup("localhost", 80), 5)
    finally:
        release.set()
        await held


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")

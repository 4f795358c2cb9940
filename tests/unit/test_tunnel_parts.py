"""Tunnels without an engine: the request, what the agent may connect to, the
relay's byte and half-close handling against a real TCP server on loopback,
which tunnels the marketplace wants, and the page a client gets meanwhile."""

from __future__ import annotations

import asyncio
import json

import pytest
from support.fakes import MemorySink

from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.local_marketplace.tunnels import relay as tunnel_relay
from gpuhost_agent.local_marketplace.tunnels.book import wanted
from gpuhost_agent.protocol import wire, wire_time
from gpuhost_agent.runtime.declared_ports import LABEL as EXPOSED_LABEL
from gpuhost_agent.runtime.engine.streams import ContainerAt, EngineStreams
from gpuhost_agent.streams.admission import connect_tunnel
from gpuhost_agent.streams.requests import Refusal, TunnelRequest, parse_request
from gpuhost_agent.streams.tunnel import NOT_LISTENING, TunnelRelay, container_addresses, declared_ports

_direct = EngineStreams().dial  # one machine's last hop: a plain connection to the container's address


async def _anything(_info: dict, _network) -> object:
    """The relay's tests dial a server on loopback, which a real tunnel refuses
    (streams/sandbox_addresses.py, tests/unit/test_sandbox_addresses.py)."""
    return lambda _address: None


TARGET = {"rentalId": "r1", "stackId": "s1", "containerId": "c" * 64}


def _request(port: int) -> TunnelRequest:
    return TunnelRequest("t1", "r1", "s1", "c" * 64, port)


def _info(ports: list[str], addresses: list[str], running: bool = True) -> dict:
    return {
        "Config": {"ExposedPorts": {port: {} for port in ports}},
        "State": {"Running": running},
        "NetworkSettings": {"Networks": {f"n{i}": {"IPAddress": a} for i, a in enumerate(addresses)}},
    }


def _at(ports: list[str], addresses: list[str], running: bool = True) -> ContainerAt:
    return ContainerAt(_info(ports, addresses, running))


def test_a_tunnel_request_names_one_tcp_port() -> None:
    assert parse_request({"type": "tunnel", "streamId": "t1", **TARGET, "port": 8080}) == _request(8080)
    for port in (0, 65536, "8080", True, None, 8080.5):
        refused = parse_request({"type": "tunnel", "streamId": "t1", **TARGET, "port": port})
        assert isinstance(refused, Refusal) and refused.status == 400 and "port" in refused.error
    tls = parse_request({"type": "tunnel", "streamId": "t1", **TARGET, "port": 8080, "tls": True})
    assert isinstance(tls, TunnelRequest) and tls.tls  # an insecure stack: TLS to the service
    refused = parse_request({"type": "tunnel", "streamId": "t1", **TARGET, "port": 8080, "tls": "yes"})
    assert isinstance(refused, Refusal) and refused.status == 400 and "tls" in refused.error


def test_only_declared_tcp_ports_and_the_containers_own_addresses() -> None:
    info = _info(["8080/tcp", "53/udp", "9000"], ["172.18.0.5", ""])
    assert declared_ports(info) == {8080, 9000}
    assert container_addresses(info) == ["172.18.0.5"]
    assert declared_ports({}) == set() and container_addresses({}) == []


def test_a_swarm_containers_expose_ports_are_declared_by_the_agents_label() -> None:
    """A Swarm task's container has ExposedPorts null for `expose:`:
    the ports the Swarm rewrite labelled are declared too."""
    info = _info(["8080/tcp"], ["10.0.1.5"])
    info["Config"]["Labels"] = {EXPOSED_LABEL: "9000,7000-7001,junk,0,70000"}
    assert declared_ports(info) == {8080, 9000, 7000, 7001}
    assert declared_ports({"Config": {"ExposedPorts": None, "Labels": {EXPOSED_LABEL: "8888"}}}) == {8888}


async def test_connect_refuses_before_any_stream_opens() -> None:
    refused = await connect_tunnel(_at(["8080/tcp"], ["127.0.0.1"]), _request(22), dial=_direct, judging=_anything)
    assert isinstance(refused, Refusal) and refused.status == 403
    refused = await connect_tunnel(
        _at(["8080/tcp"], ["127.0.0.1"], running=False), _request(8080), dial=_direct, judging=_anything
    )
    assert isinstance(refused, Refusal) and refused.status == 503 and "not running" in refused.error
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    refused = await connect_tunnel(_at([f"{port}/tcp"], ["127.0.0.1"]), _request(port), dial=_direct, judging=_anything)
    assert isinstance(refused, Refusal) and refused.status == 503 and refused.error == NOT_LISTENING


async def _echo_server() -> tuple[asyncio.base_events.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data.upper())
            await writer.drain()
        writer.write(b"BYE")  # after the client's half-close: the answer still comes
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_the_relay_carries_bytes_both_ways_and_half_closes() -> None:
    server, port = await _echo_server()
    try:
        service = await connect_tunnel(
            _at([f"{port}/tcp"], ["127.0.0.1"]), _request(port), dial=_direct, judging=_anything
        )
        assert not isinstance(service, Refusal)
        sink = MemorySink()
        relay = TunnelRelay(sink, *service)
        running = asyncio.create_task(relay.run())
        sink.type(b"hello ")
        sink.type(b"tunnel")
        await sink.until(lambda: sink.binary == b"HELLO TUNNEL")
        sink.type(json.dumps({"type": "eof"}))  # the client is done sending
        reason = await asyncio.wait_for(running, 5)
        assert bytes(sink.binary) == b"HELLO TUNNELBYE"
        assert {"type": "eof"} in sink.texts and reason == "closed" and sink.closed.is_set()
        assert (relay.bytes_up, relay.bytes_down) == (12, 15)
    finally:
        server.close()


async def test_a_stopped_tunnel_says_why() -> None:
    server, port = await _echo_server()
    try:
        service = await connect_tunnel(
            _at([f"{port}/tcp"], ["127.0.0.1"]), _request(port), dial=_direct, judging=_anything
        )
        assert not isinstance(service, Refusal)
        sink = MemorySink()
        relay = TunnelRelay(sink, *service)
        running = asyncio.create_task(relay.run())
        await asyncio.sleep(0.05)
        relay.stop("rental-ended")
        assert await asyncio.wait_for(running, 5) == "rental-ended"
        assert sink.texts[-1] == {"type": "end", "reason": "rental-ended"}
    finally:
        server.close()


def test_the_marketplace_wants_a_tunnel_per_declared_port_of_running_applied_stacks() -> None:
    store = Store.load_or_create(None)
    rental = store.create_rental(name="r", gpu_count=0, end_date=None)
    template = {"name": "n", "description": "d", "content": "services: {}\n", "environmentVariables": {}}
    stack = store.create_stack(rental["rentalId"], template)
    running = {
        "Id": "a" * 64,
        "Name": "p-web-1",
        "State": "running",
        "Labels": ["com.docker.compose.service=web"],
        "Ports": [
            {"PrivatePort": 8080, "Type": "tcp"},
            {"PrivatePort": 9000, "Type": "tcp"},
            {"PrivatePort": 53, "Type": "udp"},
        ],
    }
    stopped = {**running, "Id": "b" * 64, "State": "exited (1)"}
    unhealthy = {**running, "Id": "c" * 64, "State": "running (unhealthy)", "Ports": [{"PrivatePort": 7860}]}
    store.containers[stack["stackId"]] = {"observedAt": wire_time.iso(), "containers": [running, stopped, unhealthy]}
    assert wanted(store) == {}  # not APPLIED yet
    stack["status"] = wire.APPLIED
    found = {(key.container_id[:1], key.port): value for key, value in wanted(store).items()}
    assert found == {
        ("a", 8080): ("web", "http", "p-web-1"),
        ("a", 9000): ("web", "tcp", "p-web-1"),
        ("c", 7860): ("web", "http", "p-web-1"),
    }
    store.end_rental(rental["rentalId"])
    assert wanted(store) == {}


@pytest.mark.parametrize("starting", [True, False])
async def test_an_http_client_gets_a_page_not_a_reset(starting: bool) -> None:
    answered = asyncio.get_running_loop().create_future()

    async def tunnel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await tunnel_relay.answer_unavailable(reader, writer, 503 if starting else 404, "why", starting=starting)
        writer.close()
        answered.set_result(True)

    server = await asyncio.start_server(tunnel, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        response = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    finally:
        server.close()
    head, _, body = response.partition(b"\r\n\r\n")
    if starting:
        assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 2" in head and b"starting" in body
    else:
        assert head.startswith(b"HTTP/1.1 502 ") and b"why" in body and b"Retry-After" not in head
    assert await answered


def test_only_a_service_that_does_not_listen_yet_is_starting() -> None:
    assert tunnel_relay.is_not_listening(503, f"the agent refused: {NOT_LISTENING}")
    assert not tunnel_relay.is_not_listening(503, "the agent refused: too many open streams (64)")
    assert not tunnel_relay.is_not_listening(503, "the agent is not connected to the marketplace")
    assert not tunnel_relay.is_not_listening(
        403, "the agent refused: port 22 is not a TCP port this container declares"
    )


def test_the_ssh_command_pins_the_host_key_under_one_alias() -> None:
    from gpuhost_agent.local_marketplace.ssh_endpoint import host_key_alias, ssh_command

    alias = host_key_alias("0123456789abcdef")
    command = ssh_command(41233, "web.3f2a9c1d", alias, "ssh-ed25519 AAAAC3")
    assert alias == "gpuhost-01234567"
    assert command == (
        "ssh -i ~/.ssh/id_ed25519 -p 41233 -o HostKeyAlias=gpuhost-01234567 -o StrictHostKeyChecking=yes"
        ' -o "KnownHostsCommand=/bin/echo gpuhost-01234567 ssh-ed25519 AAAAC3" web.3f2a9c1d@127.0.0.1'
    )
    assert ssh_command(41233, "web.3f2a9c1d", alias, None) == "ssh -i ~/.ssh/id_ed25519 -p 41233 web.3f2a9c1d@127.0.0.1"

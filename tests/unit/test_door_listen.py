"""Where the worker's door listens and whom it serves (docs/swarm.md): one
address of the machine, by default its Swarm address, never every address;
and never a peer inside one of the engine's networks (a container of this
machine), with the key or without. The same from a real container on a
stack network: tests/integration/test_door_engine.py."""

from __future__ import annotations

import asyncio

import pytest
from support.door_tls import DoorTls, make_door_tls

from gpuhost_agent.service import config
from gpuhost_agent.streams.door import WorkerDoor
from gpuhost_agent.streams.door_routes import from_container

KEY = "k" * 24


@pytest.fixture
def door_tls(tmp_path) -> DoorTls:
    """The environment's CA, the leader's and a worker's certificates (service/swarm_tls.py)."""
    return make_door_tls(tmp_path)


def _worker(listen: str | None) -> config.AgentConfig:
    environ = {"GPUHOST_SWARM": "worker", "GPUHOST_SWARM_KEY": KEY}
    if listen is not None:
        environ["GPUHOST_SWARM_LISTEN"] = listen
    return config.load({}, environ=environ)


def test_the_door_listens_on_one_address_by_default_the_swarm_one() -> None:
    assert _worker(None).swarm_listen == ("", 7072)  # "": the engine's Swarm.NodeAddr, asked at start
    assert _worker(":7100").swarm_listen == ("", 7100)
    assert _worker("192.0.2.7:7072").swarm_listen == ("192.0.2.7", 7072)
    assert _worker("[2001:db8::7]:7072").swarm_listen == ("2001:db8::7", 7072)
    for wildcard in ("0.0.0.0:7072", "[::]:7072", ":::7072", "0:7072", "[::ffff:0.0.0.0]:7072", "any-name:7072"):
        with pytest.raises(config.ConfigError, match="GPUHOST_SWARM_LISTEN"):
            _worker(wildcard)


NETWORKS = [
    {"Name": "bridge", "IPAM": {"Config": [{"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.1"}]}},
    {"Name": "p_default", "IPAM": {"Config": [{"Subnet": "10.0.7.0/24"}, {"Subnet": "fd00:7::/64"}]}},
    {"Name": "host", "IPAM": {"Config": []}},
    {"Name": "docker_gwbridge", "Scope": "local", "IPAM": {"Config": [{"Subnet": "172.18.0.0/16"}]}},
    {"Name": "ingress", "Scope": "swarm", "IPAM": {"Config": [{"Subnet": "10.0.0.0/24"}]}},  # the LAN's too
    {"Name": "odd", "IPAM": None},
]


@pytest.mark.parametrize(
    ("peer", "container"),
    [
        ("172.17.0.5", True),
        ("::ffff:172.17.0.5", True),  # a dual-stack socket's view of the same
        ("10.0.7.9", True),
        ("fd00:7::9%eth0", True),
        ("172.18.0.3", True),  # a container on an overlay, through its host's gateway bridge
        ("10.0.0.5", False),  # the leader's machine on a LAN an overlay's subnet overlaps
        ("192.0.2.1", False),  # the leader's machine
        ("127.0.0.1", False),
        ("not-an-address", True),
    ],
)
def test_a_peer_inside_the_engines_networks_is_a_container(peer, container) -> None:
    assert from_container(peer, NETWORKS) is container


async def _ask(tls: DoorTls, networks) -> bytes:
    proxy = WorkerDoor(KEY, None, "/nonexistent", networks=networks, tls=tls.server())  # type: ignore[arg-type]
    port = await proxy.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls.client())
        writer.write(f"GET /gpuhost/machine HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
        try:
            answer = await asyncio.wait_for(reader.read(), 10)
        except ConnectionResetError:  # closed with the request unread
            answer = b""
        writer.close()
        return answer
    finally:
        await proxy.stop()


async def test_the_door_serves_no_peer_inside_the_engines_networks_key_or_not(door_tls) -> None:
    async def loopback_is_a_bridge() -> list[dict]:
        return [{"IPAM": {"Config": [{"Subnet": "127.0.0.0/8"}]}}]

    async def elsewhere() -> list[dict]:
        return NETWORKS

    async def engine_down() -> list[dict]:
        raise OSError("no engine")

    assert await _ask(door_tls, loopback_is_a_bridge) == b""  # closed, nothing read or said
    assert await _ask(door_tls, engine_down) == b""  # unknown networks: refused, not served unchecked
    assert (await _ask(door_tls, elsewhere)).startswith(b"HTTP/1.1 404")  # served (this door reports no machine)

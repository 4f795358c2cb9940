"""A tunnel never becomes a connection to the host, on
the real engine through the local marketplace.

The host here owns an address on its loopback interface (10.231.3x.1/32, as
a real host owns its LAN address), and a TCP server of the host listens
there, as the host's sshd would. A renter who could give a container that
address (a chosen subnet and `ipv4_address`) had the agent's tunnel dial the
host's own server: the policy now refuses the file. And whatever the engine
records for a container (here an extra network attached from outside, with
the host's address), the tunnel itself refuses to dial an address of the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess

import docker.types
import pytest
from support.stacks import TEST_IMAGE

from gpuhost_agent.protocol import wire

PORT = 9022  # the container declares it; nothing in the container listens there
HOST_BANNER = b"SSH-2.0-the-hosts-own-server\r\n"

CHOSEN_ADDRESS = f"""
services:
  app:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
    expose: ["{PORT}"]
    stop_grace_period: 1s
    networks:
      n:
        ipv4_address: {{address}}
networks:
  n:
    ipam:
      config:
        - subnet: {{subnet}}
          gateway: {{gateway}}
"""

PLAIN = f"""
services:
  app:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
    expose: ["{PORT}"]
    stop_grace_period: 1s
"""


@contextlib.asynccontextmanager
async def _host_server(address: str):
    """The host owns `address` (on lo) and serves a banner there, as sshd would."""
    await asyncio.to_thread(subprocess.run, ["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)

    async def banner(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HOST_BANNER)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(banner, address, PORT)
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()
        await asyncio.to_thread(subprocess.run, ["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False)


async def _through_tunnel(port: int) -> bytes:
    """What a renter's TCP client reads through the tunnel's local port."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_a_stack_may_not_choose_its_containers_address(local_market, docker_client) -> None:
    """Before the change the file deployed, and the tunnel to port 9022 of the
    container read the host's banner: the agent had dialled the host itself."""
    renter, _parts, _local = local_market
    address = "10.231.31.1"
    async with _host_server(address):
        rental = await renter.rental()
        content = CHOSEN_ADDRESS.format(address=address, subnet="10.231.31.0/24", gateway="10.231.31.254")
        stack_id = await renter.stack(rental, content, name="chosen-address")
        stack = await renter.wait_stack(rental, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
        if stack["status"] == wire.APPLIED:
            (tunnel,) = await renter.tunnels(rental, stack_id, 1)
            read = b""
            for _ in range(20):
                read = await _through_tunnel(tunnel["port"])
                if read:
                    break
                await asyncio.sleep(0.25)
            assert read != HOST_BANNER, "the tunnel to the container reached the host's own server"
        assert stack["status"] == wire.ERROR, stack
        assert "ipv4_address" in stack["errorMsg"] and "ipam" in stack["errorMsg"], stack["errorMsg"]
        assert "the engine assigns" in stack["errorMsg"], stack["errorMsg"]
        created = await asyncio.to_thread(
            docker_client.containers.list, all=True, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}
        )
        assert created == []


async def test_the_tunnel_refuses_an_address_of_the_host_whatever_the_engine_recorded(
    local_market, docker_client
) -> None:
    """The stack's container is also given, from outside the agent, an address
    of the host on a network that even carries the stack's project label. The
    tunnel tries the container's addresses: before the change it reached the
    host's server through that one; now it refuses it and reaches nothing (no
    service listens in the container)."""
    renter, _parts, local = local_market
    address = "10.231.32.1"
    rental = await renter.rental()
    stack_id = await renter.stack(rental, PLAIN, name="host-address")
    stack = await renter.wait_stack(rental, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    (container,) = await asyncio.to_thread(
        docker_client.containers.list, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}
    )
    project = container.labels["com.docker.compose.project"]
    ipam = docker.types.IPAMConfig(
        pool_configs=[docker.types.IPAMPool(subnet="10.231.32.0/24", gateway="10.231.32.254")]
    )
    network = await asyncio.to_thread(
        docker_client.networks.create,
        "0gpuhost-test-host-address",
        ipam=ipam,
        labels={"com.docker.compose.project": project, "com.docker.compose.network": "extra"},
    )
    try:
        async with _host_server(address):
            await asyncio.to_thread(network.connect, container, ipv4_address=address)
            (tunnel,) = await renter.tunnels(rental, stack_id, 1)
            assert await _through_tunnel(tunnel["port"]) != HOST_BANNER, "the tunnel reached the host's own server"
            from gpuhost_agent.local_marketplace.channel_hub import StreamRefused

            with pytest.raises(StreamRefused) as refused:
                await local.state.streams.open(
                    "tunnel", rental, {"stackId": stack_id, "containerId": container.id, "port": PORT}
                )
            assert refused.value.status == 503, refused.value.message
    finally:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(network.disconnect, container, force=True)
        await asyncio.to_thread(network.remove)

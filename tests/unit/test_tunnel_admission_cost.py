"""What a new tunnel connection costs the agent before it dials:
one engine call, the container's inspect. A network's inspect is kept by its
full id (its labels and subnets are fixed for its life, and an id is never
given twice). The host's addresses are not kept: they are read for every
connection (a second's cache let a tunnel reach an address the host had
just gained; tests/integration/test_tunnel_addresses_engine.py)."""

from __future__ import annotations

import ipaddress

from aiohttp import web

from gpuhost_agent.runtime.engine import streams as engine_streams
from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.streams import tunnel

NET = "a" * 64


async def _engine(tmp_path, calls: list[str]) -> web.AppRunner:
    async def network(request: web.Request) -> web.Response:
        calls.append(request.match_info["id"])
        ident = request.match_info["id"]
        full = NET if NET.startswith(ident) else ident.ljust(64, "0")
        return web.json_response({"Id": full, "Labels": {}, "IPAM": {"Config": [{"Subnet": "172.30.0.0/24"}]}})

    app = web.Application()
    app.router.add_get("/networks/{id}", network)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, str(tmp_path / "docker.sock")).start()
    return runner


async def test_a_networks_inspect_is_asked_once_by_its_full_id_and_the_kept_ones_are_bounded(
    tmp_path, monkeypatch
) -> None:
    calls: list[str] = []
    runner = await _engine(tmp_path, calls)
    engine = EngineStreams(f"unix://{tmp_path / 'docker.sock'}")
    try:
        first = await engine.network(NET)
        assert await engine.network(NET) == first and calls == [NET]
        await engine.network(NET[:12])  # a short id is not the key a container's inspect gives: asked each time
        await engine.network(NET[:12])
        assert calls == [NET, NET[:12], NET[:12]]
        monkeypatch.setattr(engine_streams, "NETWORKS_KEPT", 3)
        for n in range(5):
            await engine.network(str(n) * 64)
        calls.clear()
        await engine.network(NET)  # the oldest went when the newer came
        assert calls == [NET]
    finally:
        await engine.close()
        await runner.cleanup()


async def test_the_hosts_addresses_are_read_for_every_connection(monkeypatch) -> None:
    """An address the host gains is refused from the next connection on."""
    host: list = []
    monkeypatch.setattr(tunnel, "read_host_networks", lambda: list(host))
    info = {
        "Id": "c" * 64,
        "NetworkSettings": {"Networks": {"extra": {"IPAddress": "10.231.32.1", "NetworkID": NET}}},
        "Config": {"Labels": {"com.docker.compose.project": "p"}},
    }

    async def network(_network_id: str) -> dict:
        labels = {"com.docker.compose.project": "p"}
        return {"Id": NET, "Labels": labels, "IPAM": {"Config": [{"Subnet": "10.231.32.0/24"}]}}

    assert (await tunnel.address_judge(info, network))("10.231.32.1") is None
    host.append(ipaddress.ip_network("10.231.32.1/32"))  # the host takes that address
    why = (await tunnel.address_judge(info, network))("10.231.32.1")
    assert why is not None and "an address of the host itself" in why

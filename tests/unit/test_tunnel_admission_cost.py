"""What a new tunnel connection costs the agent before it dials (issue 36):
one engine call, the container's inspect. A network's inspect is kept by its
full id (its labels and subnets are fixed for its life, and an id is never
given twice); the host's addresses are read at most once a second."""

from __future__ import annotations

from aiohttp import web

from gpuhost_agent.runtime import engine_streams
from gpuhost_agent.runtime.engine_streams import EngineStreams
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


async def test_the_hosts_addresses_are_read_at_most_once_a_second(monkeypatch) -> None:
    reads: list[int] = []

    def read() -> list:
        reads.append(1)
        return []

    monkeypatch.setattr(tunnel, "read_host_networks", read)
    recent = tunnel._RecentHostNetworks()
    for _ in range(20):
        await recent.current()
    assert len(reads) == 1
    monkeypatch.setattr(tunnel, "HOST_NETWORKS_SECONDS", 0.0)
    await recent.current()
    assert len(reads) == 2

"""Network speed test against the marketplace: real HTTP on loopback sockets."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time

import aiohttp
import psutil
import pytest
from aiohttp import web

from gpuhost_agent.inventory import netspeed
from gpuhost_agent.inventory.netspeed import SpeedResult, as_wire, measure_speed
from gpuhost_agent.local_marketplace import speedtest_api


async def _serve(app: web.Application):
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/v1"


@pytest.fixture
async def served():
    """Start an app built by the test on a real port; clean all of them up afterwards."""
    runners = []

    async def start(app: web.Application) -> str:
        runner, base = await _serve(app)
        runners.append(runner)
        return base

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


def _speedtest_app() -> web.Application:
    app = web.Application()
    app.add_routes(speedtest_api.routes())
    return app


async def test_both_directions_give_a_speed(served, http):
    base = await served(_speedtest_app())
    result = await measure_speed(http, base, max_bytes=5_000_000, max_seconds=5)
    assert result.error is None
    assert result.download_mbps > 0 and result.upload_mbps > 0
    assert result.download_bytes == 5_000_000 and result.upload_bytes == 5_000_000
    assert result.measured_at.endswith("Z")
    # Measured, but the marketplace is on this machine: no speed of the host's network is published.
    assert result.same_machine == "127.0.0.1"
    wire_shape = as_wire(result)
    assert wire_shape == {
        "uploadMbps": None,
        "downloadMbps": None,
        "measuredAt": result.measured_at,
        "bytesDown": 5_000_000,
        "bytesUp": 5_000_000,
        "error": f"not published: the marketplace is on this machine (127.0.0.1), so the bytes never "
        f"crossed the network (measured {result.download_mbps:g} Mbit/s down, {result.upload_mbps:g} Mbit/s up)",
    }
    # The same figures from a marketplace elsewhere are published as measured.
    remote = dataclasses.replace(result, same_machine=None)
    assert as_wire(remote) == {
        **wire_shape,
        "uploadMbps": result.upload_mbps,
        "downloadMbps": result.download_mbps,
        "error": None,
    }


def _own_address() -> str | None:
    """A non-loopback IPv4 address of this machine's own interfaces, if it has one."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return None


async def test_the_hosts_own_address_is_the_same_machine_too(http):
    """A local marketplace reached at the host's own address is not loopback
    by name, but the bytes still never leave the machine."""
    own = _own_address()
    if own is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    runner = web.AppRunner(_speedtest_app(), shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, own, 0)
    await site.start()
    try:
        result = await measure_speed(
            http, f"http://{own}:{runner.addresses[0][1]}/v1", max_bytes=100_000, max_seconds=10.0
        )
    finally:
        await runner.cleanup()
    assert result.same_machine == own and as_wire(result)["downloadMbps"] is None


def test_which_addresses_are_this_machine():
    own = {"10.1.2.3", "fd00::2"}
    assert netspeed.same_machine("127.0.0.1", own) and netspeed.same_machine("127.3.4.5", own)
    assert netspeed.same_machine("::1", own) and netspeed.same_machine("::ffff:127.0.0.1", own)
    assert netspeed.same_machine("10.1.2.3", own) and netspeed.same_machine("fd00::2", own)
    assert not netspeed.same_machine("10.1.2.4", own)
    assert not netspeed.same_machine("2001:db8::1", own)
    assert not netspeed.same_machine("not an address", own)


async def test_the_marketplace_address_is_resolved_as_the_connection_would():
    """IP literals and localhost only: no lookup leaves this machine."""
    assert await netspeed.marketplace_on_this_machine("http://192.0.2.200:1/v1") is None  # not one of ours
    assert await netspeed.marketplace_on_this_machine("http://localhost:1/v1") in {"127.0.0.1", "::1"}
    assert await netspeed.marketplace_on_this_machine("http://[::1]:1/v1") == "::1"


async def test_max_bytes_bounds_both_directions(served, http):
    base = await served(_speedtest_app())
    result = await measure_speed(http, base, max_bytes=1_000_000, max_seconds=5)
    assert result.error is None
    assert result.download_bytes == 1_000_000
    assert result.upload_bytes == 1_000_000  # counted by the server, where the bytes arrive


async def test_max_seconds_bounds_a_slow_link(served, http):
    async def slow_download(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = 100_000_000
        await response.prepare(request)
        try:
            for _ in range(10_000):
                await response.write(b"\0" * 16_384)
                await asyncio.sleep(0.02)
        except ConnectionError:
            pass
        return response

    async def slow_upload(request: web.Request) -> web.Response:
        received, start = 0, time.monotonic()
        async for chunk in request.content.iter_chunked(65_536):
            received += len(chunk)
            await asyncio.sleep(0.005)
        return web.json_response({"receivedBytes": received, "seconds": time.monotonic() - start})

    app = web.Application()
    app.add_routes(
        [web.get("/v1/agent/speedtest/download", slow_download), web.post("/v1/agent/speedtest/upload", slow_upload)]
    )
    base = await served(app)
    started = time.monotonic()
    result = await measure_speed(http, base, max_bytes=150_000_000, max_seconds=0.5)
    elapsed = time.monotonic() - started
    assert result.error is None
    assert 0 < result.download_bytes < 150_000_000 and result.download_mbps > 0
    assert 0 < result.upload_bytes < 150_000_000 and result.upload_mbps > 0
    assert elapsed < 5  # ~0.5 s each way, plus draining what the socket buffers held


async def test_marketplace_without_the_endpoints(served, http):
    base = await served(web.Application())
    result = await measure_speed(http, base, max_bytes=1_000_000, max_seconds=2)
    assert isinstance(result, SpeedResult)
    assert result.download_mbps is None and result.upload_mbps is None
    assert result.error == "download: HTTP 404; upload: HTTP 404"
    assert as_wire(result)["error"] == result.error


async def test_marketplace_not_listening(http):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = await measure_speed(http, f"http://127.0.0.1:{port}/v1", max_bytes=1_000_000, max_seconds=2)
    assert result.download_mbps is None and result.upload_mbps is None
    assert result.download_bytes == 0 and result.upload_bytes == 0
    assert result.error == "download: marketplace did not answer; upload: marketplace did not answer"


async def test_download_parameters(served, http, monkeypatch):
    base = await served(_speedtest_app())
    for bad in ("abc", "0", "-5"):
        async with http.get(f"{base}/agent/speedtest/download", params={"bytes": bad}) as resp:
            assert resp.status == 400
            assert "bytes" in (await resp.json())["message"]
    monkeypatch.setattr(speedtest_api, "MAX_DOWNLOAD_BYTES", 300_000)
    async with http.get(f"{base}/agent/speedtest/download", params={"bytes": "5000000"}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/octet-stream"
        assert resp.headers["Cache-Control"] == "no-store"
        assert resp.content_length == 300_000
        assert len(await resp.read()) == 300_000


async def test_upload_above_the_cap(served, http, monkeypatch):
    monkeypatch.setattr(speedtest_api, "MAX_UPLOAD_BYTES", 100_000)
    base = await served(_speedtest_app())
    url = f"{base}/agent/speedtest/upload"
    async with http.post(url, data=b"x" * 200_000) as resp:  # declared length
        assert resp.status == 413
        assert "100000" in (await resp.json())["message"]

    async def stream():
        for _ in range(4):
            yield b"x" * 65_536

    async with http.post(url, data=stream()) as resp:  # chunked, no length
        assert resp.status == 413
    result = await measure_speed(http, base, max_bytes=50_000, max_seconds=2)
    assert result.download_mbps is not None and result.upload_bytes == 50_000
    result = await measure_speed(http, base, max_bytes=1_000_000, max_seconds=2)
    assert result.upload_mbps is None and result.error == "upload: HTTP 413"


async def test_client_hanging_up_early_is_quiet(served, http, caplog):
    base = await served(_speedtest_app())
    caplog.set_level(logging.DEBUG)
    async with http.get(f"{base}/agent/speedtest/download", params={"bytes": "200000000"}) as resp:
        assert len(await resp.content.readany()) > 0
        resp.close()
    await asyncio.sleep(0.3)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_chunks_are_incompressible():
    import zlib

    assert len(zlib.compress(netspeed._BLOCK)) > 0.99 * len(netspeed._BLOCK)
    assert len(speedtest_api._BLOCK) == speedtest_api.CHUNK_BYTES == 256 * 1024

"""The marketplace's installation line pasted on a fresh Debian 12: install.sh
comes from the marketplace and its progress arrives as the environment's
initState. (The chroots: tests/support/install_chroot.py. Needs root.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from aiohttp import web
from support.agent_release import agent_wheel
from support.install_chroot import Run, Scenario, add, conf_values, needs_root
from support.openapi_check import AGENT_DOC, check_named, load

from gpuhost_agent.local_marketplace.install_release import InstallRelease
from gpuhost_agent.local_marketplace.releases import Release
from gpuhost_agent.local_marketplace.script_api import install_line
from gpuhost_agent.local_marketplace.server import build_app
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import wire, wire_time

# ---- the marketplace's line ----------------------------------------------------------------


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


async def _run_async(scenario: Scenario, command: str) -> Run:
    """scenario.run in a thread, so the test's marketplace keeps serving."""
    return await asyncio.to_thread(scenario.run, "bash", "-c", command)


@needs_root
async def test_the_marketplace_line_installs_the_agent_and_reports_init_state(
    scenario: Scenario, agent_wheels: Path, tmp_path: Path
) -> None:
    """The local marketplace's GET /environments/{envId}/script, pasted in the chroot:
    install.sh comes from GET /install.sh (no key), the agent from the release the
    marketplace signed (GET /agent/release, checked with the key the line pins), and
    its progress arrives as the environment's initState."""
    store = Store.load_or_create(None)
    state = MarketplaceState(store)
    release = await asyncio.to_thread(lambda: Release.of_wheel(agent_wheel(agent_wheels)))
    state.install_release = InstallRelease(lambda: release, None, tmp_path / "built")
    app = build_app(state)
    asked: list[str] = []

    async def record(request: web.Request, _response: web.StreamResponse) -> None:
        asked.append(request.path)

    app.on_response_prepare.append(record)
    runner, base = await _serve(app)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(
                f"{base}/environments/{store.envId}/script", headers={wire.API_KEY_HEADER: store.renterApiKey}
            ) as response:
                assert response.status == 200
                line = await response.json()
        assert line == install_line(base, store.envId, store.envApiKey, state.release_public_key())

        await asyncio.to_thread(add, scenario, "sudo", "curl")
        failed = await _run_async(scenario, line)  # no Docker, no NVIDIA here yet
        assert failed.code == 3, failed.both
        init = store.host["initState"]
        check_named(await asyncio.to_thread(load, AGENT_DOC), init, "InitState")  # the documented shape, no field more
        assert init["state"] == "failed" and init["error"].startswith("install: Docker Engine is not installed")
        assert [p["name"] for p in init["phases"]][:2] == ["install", "config"]

        await asyncio.to_thread(add, scenario, "docker", "compose", "nvidia", "toolkit")
        done = await _run_async(scenario, line)
        assert done.code == 0, done.both
        # No checkout: the marketplace's release, its signature checked before its wheel was fetched
        assert "(source: the marketplace's signed release)" in done.out
        assert f"the marketplace's release {release.version} is signed with the pinned key" in done.out
        assert asked.index("/v1/agent/release") < asked.index(f"/v1/agent/releases/{release.wheel.name}")
        installed = await asyncio.to_thread(scenario.run, "/opt/gpuhost-agent/venv/bin/gpuhost-agent", "version")
        assert installed.out.strip() == release.version
        init = store.host["initState"]
        check_named(await asyncio.to_thread(load, AGENT_DOC), init, "InitState")
        install_phase = init["phases"][0]
        assert (init["state"], init["error"], install_phase["name"], install_phase["state"]) == (
            "starting",
            None,
            "install",
            "done",
        )
        assert wire_time.is_iso(install_phase["finishedAt"]) and wire_time.is_iso(init["updatedAt"])
        assert await asyncio.to_thread(scenario.read, "/etc/gpuhost-agent/api-key") == store.envApiKey + "\n"
        # The marketplace's release key, pinned: the agent installs only releases it signed
        pinned = await asyncio.to_thread(scenario.read, "/etc/gpuhost-agent/release-key.pub")
        assert pinned == state.release_public_key() + "\n"
        conf = conf_values(await asyncio.to_thread(scenario.read, "/etc/gpuhost-agent/agent.conf"))
        assert (conf["GPUHOST_MARKETPLACE_URL"], conf["GPUHOST_ENV_ID"]) == (base, store.envId)
        curls = [call for call in await asyncio.to_thread(scenario.calls) if call.startswith("curl ")]
        assert any("/agent/init-state" in call for call in curls)
        assert not [call for call in curls if store.envApiKey in call], "the key was on curl's command line"
        # Nor on sudo's, nor bash's: it reaches install.sh on its standard input.
        assert not [call for call in await asyncio.to_thread(scenario.calls) if store.envApiKey in call]
        assert store.envApiKey not in done.both and store.envApiKey not in failed.both
    finally:
        await runner.cleanup()

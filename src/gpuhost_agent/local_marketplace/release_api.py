"""The releases' routes, with the environment's key like every agent call:
`GET /v1/agent/release`, the signed release the installation line installs
(install_release.py), and `GET /v1/agent/releases/{file}`, its wheel or the
one offered for upgrades (docs/agent-api.yaml)."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from gpuhost_agent.local_marketplace.http_errors import json_error
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.protocol.wire_release import RELEASES_PATH


def routes(state: MarketplaceState) -> list[web.RouteDef]:
    async def get_install_release(_request: web.Request) -> web.Response:
        if state.install_release is None:
            return json_error(404, "this marketplace has no release to install")
        try:
            release = await state.install_release.release()
        except LookupError as exc:
            return json_error(404, str(exc))
        return web.json_response(release.offer(state.release_key()), headers={"Cache-Control": "no-store"})

    async def get_release(request: web.Request) -> web.StreamResponse:
        name = request.match_info["file"]
        wheel = _wheel_named(state, name)
        if wheel is None:
            offered = state.release.wheel.name if state.release else "no release"
            return json_error(404, f"release {name[:200]} not found: this marketplace offers {offered}")
        return web.FileResponse(wheel, headers={"Content-Type": "application/octet-stream"})

    return [
        web.get("/v1/agent/release", get_install_release),
        web.get("/v1" + RELEASES_PATH + "{file}", get_release),
    ]


def _wheel_named(state: MarketplaceState, name: str) -> Path | None:
    if state.release is not None and name == state.release.wheel.name:
        return state.release.wheel
    return state.install_release.wheel(name) if state.install_release is not None else None

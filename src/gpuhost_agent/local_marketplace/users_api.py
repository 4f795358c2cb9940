"""The seed's user endpoints that concern the agent: the current user and the
SSH keys a renter logs in to a rental's containers with."""

from __future__ import annotations

from aiohttp import web

from gpuhost_agent.local_marketplace import ssh_keys
from gpuhost_agent.local_marketplace.http_errors import json_body, json_error
from gpuhost_agent.local_marketplace.state import MarketplaceState


def routes(state: MarketplaceState) -> list[web.RouteDef]:
    store = state.store

    async def get_me(_request: web.Request) -> web.Response:
        return web.json_response(ssh_keys.user(store.userId, store.sshKeys))

    async def create_ssh_key(request: web.Request) -> web.Response:
        try:
            key = ssh_keys.new_key(await json_body(request), store.sshKeys)
        except ssh_keys.KeyRefused as exc:
            return json_error(400, str(exc))
        except ssh_keys.KeyConflict as exc:
            return json_error(409, str(exc))
        store.sshKeys.append(key)
        store.save()
        return web.json_response(key)

    async def delete_ssh_key(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        kept = [key for key in store.sshKeys if key["name"] != name]
        if len(kept) == len(store.sshKeys):
            return json_error(404, f"no SSH key named {name!r}")
        store.sshKeys[:] = kept
        store.save()
        return web.Response(status=204)

    return [
        web.get("/v1/users/me", get_me),
        web.post("/v1/users/ssh-key", create_ssh_key),
        web.delete("/v1/users/ssh-key/{name}", delete_ssh_key),
    ]

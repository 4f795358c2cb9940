"""How a renter revokes access to a stack's basic-auth tunnels: a new password.
Every session cookie a sign-in link set, every link not yet used
and the old password stop working at the tunnels' next look at the store
(tunnels/book.py, within half a second); the new password is in the answer and in
the tunnel info from then on."""

from __future__ import annotations

import asyncio

from aiohttp import web

from gpuhost_agent.local_marketplace.http_errors import json_error
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store_records import Conflict
from gpuhost_agent.local_marketplace.tunnels import auth as tunnel_auth


def routes(state: MarketplaceState) -> list[web.RouteDef]:
    async def new_password(request: web.Request) -> web.Response:
        rental_id, stack_id = request.match_info["rentalId"], request.match_info["stackId"]
        try:
            generation, plain = state.store.next_tunnel_password(rental_id, stack_id)
        except Conflict as exc:  # a well-formed request the stack's state refuses: 409, not 400 (RFC 9110)
            return json_error(409, str(exc))
        # PBKDF2 takes tens of milliseconds: off the event loop that serves every tunnel.
        password_hash = await asyncio.to_thread(tunnel_auth.hash_password, plain)
        credentials = state.store.set_tunnel_password(rental_id, stack_id, generation, password_hash)
        await state.tunnels.sync()
        return web.json_response({"username": credentials["username"], "password": plain})

    return [web.post("/v1/rentals/{rentalId}/stacks/{stackId}/tunnel-password", new_password)]

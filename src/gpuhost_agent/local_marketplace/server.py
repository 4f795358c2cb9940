"""The local marketplace's aiohttp application: auth, errors and start-up.

Two keys, as on the real marketplace: renters use their user API key; the agent
uses the environment's own key (Environment.apiKey). Neither can call the
other's endpoints, and renter responses never show the environment's key.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.local_marketplace import (
    agent_api,
    channel_api,
    host_api,
    host_listing_api,
    listings_api,
    logs_api,
    marketplace_only_api,
    release_api,
    renter_api,
    script_api,
    speedtest_api,
    terminal_api,
    users_api,
)
from gpuhost_agent.local_marketplace.http_errors import BadRequest, json_error, same_secret
from gpuhost_agent.local_marketplace.parse_errors import JsonErrorsRunner
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Conflict, NotFound
from gpuhost_agent.local_marketplace.tunnels import password_api as tunnel_password_api
from gpuhost_agent.protocol import wire

log = get_logger(__name__)

# Longer than aiohttp's client keeps an idle pooled connection (15 s), so the
# agent never reuses one the server is closing at that moment.
IDLE_SECONDS = 20.0
_SESSION_ID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


def _is_public(request: web.Request) -> bool:
    """Paths served without an API key: install.sh (curl | bash sends no header)
    and the terminal WebSocket (browsers cannot set one; its handler checks the
    ticket's token). The terminal is matched by the route aiohttp resolved, not
    by a path prefix, so no spelling of another path can pass for it."""
    if request.path in script_api.PUBLIC_PATHS:
        return True
    route = request.match_info.route
    resource = route.resource
    return route.method == "GET" and resource is not None and resource.canonical == terminal_api.TERMINAL_ROUTE


def build_app(state: MarketplaceState) -> web.Application:
    @web.middleware
    async def auth_and_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        agent_path = request.path.startswith("/v1/agent/")
        expected = state.store.envApiKey if agent_path else state.store.renterApiKey
        if not _is_public(request) and not same_secret(request.headers.get(wire.API_KEY_HEADER), expected):
            return json_error(401, f"missing or invalid {wire.API_KEY_HEADER} header")
        session = request.headers.get(wire.SESSION_HEADER)
        if agent_path and session is not None and not _SESSION_ID.fullmatch(session):
            return json_error(400, f"{wire.SESSION_HEADER} must be the sessionId of POST /agent/sessions (a UUID)")
        try:
            return await handler(request)
        except NotFound as exc:
            return json_error(404, str(exc))
        except (BadRequest, Conflict) as exc:
            return json_error(400, str(exc))
        except web.HTTPException as exc:
            if exc.status >= 400:
                answer = json_error(exc.status, exc.reason)
                if "Allow" in exc.headers:  # a 405 says which methods the path has (RFC 9110)
                    answer.headers["Allow"] = exc.headers["Allow"]
                return answer
            raise
        except Exception:  # a bug: answer in the API's error shape, keep the trace for operators
            log.exception("marketplace_handler_failed", method=request.method, path=request.path)
            return json_error(500, "internal error in the local marketplace")

    app = web.Application(middlewares=[auth_and_errors], client_max_size=2 * 1024 * 1024)
    app.add_routes(marketplace_only_api.routes())  # first: /rentals/checkout is not a {rentalId}
    app.add_routes(listings_api.routes(state))  # first: listings is not an {envId}
    app.add_routes(renter_api.routes(state))
    app.add_routes(agent_api.routes(state))
    app.add_routes(release_api.routes(state))
    app.add_routes(channel_api.routes(state))
    app.add_routes(logs_api.routes(state))
    app.add_routes(terminal_api.routes(state))
    app.add_routes(host_api.routes(state))
    app.add_routes(host_listing_api.routes(state))
    app.add_routes(speedtest_api.routes())
    app.add_routes(script_api.routes(state))
    app.add_routes(users_api.routes(state))
    app.add_routes(tunnel_password_api.routes(state))
    return app


@dataclass
class RunningMarketplace:
    runner: web.AppRunner
    base_url: str
    state: MarketplaceState

    expiry: asyncio.Task | None = None
    tunnels: asyncio.Task | None = None

    async def stop(self) -> None:
        self.state.close_polls()
        for task in (self.expiry, self.tunnels):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self.expiry, self.tunnels) if t is not None), return_exceptions=True)
        await self.state.streams.shutdown()  # open WebSockets would hold the shutdown for its whole timeout
        await self.runner.cleanup()


async def start(
    state: MarketplaceState,
    host: str = "127.0.0.1",
    port: int = 8787,
    *,
    idle_seconds: float = IDLE_SECONDS,
    tls: ssl.SSLContext | None = None,
) -> RunningMarketplace:
    """Serve on host:port (port 0 picks a free one) and return the base URL.
    A connection that sends nothing (no request yet, or none since the last
    answer, or a request line and headers that stop coming) is closed after
    `idle_seconds`, so idle clients cannot hold the server's descriptors.
    With `tls`, over HTTPS: an agent takes plain http from this machine only
    (service/settings.py), so a marketplace for other machines needs it."""
    state.streams.reopen()
    state.closing = False  # a marketplace started again after a stop (tests of outages) serves polls again
    runner = JsonErrorsRunner(build_app(state), access_log=None, shutdown_timeout=2, keepalive_timeout=idle_seconds)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    bound_port = runner.addresses[0][1]
    url_host = f"[{host}]" if ":" in host else host
    base_url = f"{'https' if tls else 'http'}://{url_host}:{bound_port}/v1"
    log.info("local_marketplace_listening", base_url=base_url, env_id=state.store.envId)
    expiry = asyncio.create_task(state.expire_rentals_forever(), name="rental-expiry")
    tunnels = asyncio.create_task(state.tunnels.run(), name="tunnels")
    return RunningMarketplace(runner, base_url, state, expiry, tunnels)

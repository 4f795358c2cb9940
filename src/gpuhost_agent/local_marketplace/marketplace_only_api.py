"""The seed's operations that belong to the marketplace alone: 501, said plainly.

Favorites, checkout, custom templates, API-key management, notifications,
the sign-in redirect and deleting the environment are the marketplace's
business (payments, accounts, a catalogue of many hosts); the local
marketplace has one user, one environment (the host it runs on) and no
payments. Answered by aiohttp's router they would be a 404 or 405, which a
developer holding the seed cannot tell from a wrong path; each answers 501
with the operation's name instead, and a path it shares with a served
operation (DELETE /environments/{envId}) keeps the served methods.

Registered before the served routes so that a literal segment (checkout)
never falls into a served path's variable ({rentalId}); any other method on
such a path is a 405 whose `Allow` names that path's own methods, not those
of the variable path aiohttp would otherwise add in.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from gpuhost_agent.local_marketplace.http_errors import json_error, other_methods

# (the seed's operation name, method, path under /v1), as in the seed's endpoint table.
OPERATIONS = (
    ("Update custom template", "PATCH", "/templates/custom/{templateId}"),
    ("Create custom template", "POST", "/templates/custom"),
    ("List custom templates", "GET", "/templates/custom"),
    ("Delete environment", "DELETE", "/environments/{envId}"),
    ("Get favorite status", "GET", "/environments/{envId}/listing/favorite"),
    ("Set favorite", "POST", "/environments/{envId}/listing/favorite"),
    ("Remove favorite", "DELETE", "/environments/{envId}/listing/favorite"),
    ("Create rental checkout session", "POST", "/rentals/checkout"),
    ("Create API key", "POST", "/users/api-keys"),
    ("List API keys", "GET", "/users/api-keys"),
    ("Delete API key", "DELETE", "/users/api-keys/{apiKeyId}"),
    ("Update user notification status", "PATCH", "/users/notifications/{notificationId}"),
    ("Delete user notification", "DELETE", "/users/notifications/{notificationId}"),
    ("Get notifications by status", "GET", "/users/notifications/status/{status}"),
    ("Get user redirect URL", "GET", "/users/redirect"),
)


def message(operation: str) -> str:
    return f"{operation} is served by the marketplace, not by the local marketplace"


def _not_here(operation: str) -> Handler:
    async def handler(_request: web.Request) -> web.Response:
        return json_error(501, message(operation))

    return handler


# Literal paths a served path's variable also matches (/rentals/{rentalId}).
SHADOWING = ("/rentals/checkout",)


def routes() -> list[web.RouteDef]:
    served = [web.route(method, "/v1" + path, _not_here(name)) for name, method, path in OPERATIONS]
    fallbacks = [other_methods("/v1" + path, tuple(m for _n, m, p in OPERATIONS if p == path)) for path in SHADOWING]
    return served + fallbacks

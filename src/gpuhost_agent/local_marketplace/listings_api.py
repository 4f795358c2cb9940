"""The renter's catalogue: the seed's "Get environment listings" and "Get listing filters".

The seed gives the listings query's filters by meaning only; the names here
(documented in docs/local-marketplace-api.yaml) are the Listing's own field
names where there is one. Only a listed environment (`isListed`, set by the
host) is in the catalogue, as on the marketplace. The local marketplace has
one environment, so a page is that listing or nothing; the pagination still
works as the seed's does (listings in envId order, `lastEvaluatedKey` the
last envId of a page that stopped at `limit` with more after it), so a client
written against it pages the marketplace unchanged.

Registered before /environments/{envId}: "listings" is not an envId.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gpuhost_agent.local_marketplace import shapes
from gpuhost_agent.local_marketplace.http_errors import BadRequest, other_methods
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store

MAX_LIMIT = 100
LISTINGS = "/v1/environments/listings"


# The document's patterns (docs/local-marketplace-api.yaml), so that what the
# schema allows is taken and what it refuses is a 400: plain decimals, no
# signs, exponents, underscores or infinities that float() would also read.
_NUMBER = r" *[0-9]+(?:\.[0-9]+)? *"
NUMBERS = re.compile(rf"{_NUMBER}(?:,{_NUMBER}){{0,63}}")
PRICE = re.compile(rf"{_NUMBER}(?:,{_NUMBER})?")
LIMIT = re.compile(r"[0-9]{1,3}")


def _values(query: dict[str, str], key: str) -> list[str] | None:
    """A comma-separated filter; none given, or only commas and spaces, is no filter."""
    values = [value.strip() for value in query.get(key, "").split(",") if value.strip()]
    return values or None


def _numbers(query: dict[str, str], key: str, form: re.Pattern[str] = NUMBERS) -> list[float] | None:
    if key not in query:
        return None
    if not form.fullmatch(query[key]):
        raise BadRequest(f"{key} must be a comma-separated list of plain decimal numbers (1 to 64 of them)")
    return [float(value) for value in query[key].split(",")]


def matcher(query: dict[str, str]) -> Callable[[dict], bool]:
    """The filters of a listings query as one test of a shaped Listing; raises
    BadRequest naming the parameter that cannot be read."""
    names, env_ids, locations = _values(query, "gpuName"), _values(query, "envId"), _values(query, "location")
    vrams, counts = _numbers(query, "gpuVRAM"), _numbers(query, "availableGPUs")
    price = _numbers(query, "price", PRICE)
    kind = query.get("type")
    available = query.get("available")
    if available not in (None, "true", "false"):
        raise BadRequest("available must be true or false")
    low, high = (0.0, price[0]) if price is not None and len(price) == 1 else (price or [0.0, math.inf])

    def matches(listing: dict) -> bool:
        checks = (
            names is None or listing["gpuName"] in names,
            env_ids is None or listing["envId"] in env_ids,
            locations is None or listing["location"] in locations,
            vrams is None or listing["gpuVRAM"] in vrams,
            counts is None or listing["availableGPUs"] >= min(counts),
            kind is None or listing["type"]["name"] == kind,
            available is None or (listing["availableGPUs"] > 0) == (available == "true"),
            low <= listing["pricing"]["pricePerGpu"] <= high,
        )
        return all(checks)

    return matches


def listed(store: Store) -> list[dict]:
    """The catalogue, in envId order: the one environment, if its host listed it."""
    listing = shapes.listing(store)
    return [shapes.renters_listing(listing)] if listing["isListed"] else []


def page(listings: list[dict], query: dict[str, str]) -> dict[str, Any]:
    raw = query.get("limit", str(MAX_LIMIT))
    limit = int(raw) if LIMIT.fullmatch(raw) else 0
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    after = query.get("lastEvaluatedKey")
    wanted = [listing for listing in listings if after is None or listing["envId"] > after]
    answer: dict[str, Any] = {"listings": wanted[:limit]}
    if len(wanted) > limit:
        answer["lastEvaluatedKey"] = wanted[limit - 1]["envId"]
    return answer


def filters(listings: list[dict]) -> dict[str, Any]:
    """The seed's Listing filters: the values the catalogue holds now."""
    prices = [listing["pricing"]["pricePerGpu"] for listing in listings]
    return {
        "locations": sorted({listing["location"] for listing in listings if listing["location"] is not None}),
        "models": sorted({listing["gpuName"] for listing in listings if listing["gpuName"] is not None}),
        "types": sorted({listing["type"]["name"] for listing in listings}),
        "vrams": sorted({listing["gpuVRAM"] for listing in listings if listing["gpuVRAM"] is not None}),
        "availableGPUs": sorted({listing["availableGPUs"] for listing in listings}),
        "minPrice": min(prices, default=0.0),
        "maxPrice": max(prices, default=0.0),
    }


def routes(state: MarketplaceState) -> list[web.RouteDef]:
    store = state.store

    async def get_listings(request: web.Request) -> web.Response:
        query = dict(request.query)
        matches = matcher(query)
        return web.json_response(page([listing for listing in listed(store) if matches(listing)], query))

    async def get_filters(_request: web.Request) -> web.Response:
        return web.json_response(filters(listed(store)))

    return [
        web.get(LISTINGS, get_listings),
        other_methods(LISTINGS, ("GET",)),
        web.get(LISTINGS + "/filters", get_filters),
    ]

"""The host's side of the listing: setting it (PATCH .../listing) and the usage page (GET .../usage).

The price a host sets applies from the quarter hour it is set in (the usage
slots'): each change is kept with its time (Store.priceHistory), so that the
usage page values every slot at the price then in force, never today's price
backwards.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from aiohttp import web

from gpuhost_agent.local_marketplace import shapes, usage
from gpuhost_agent.local_marketplace.http_errors import json_body, json_error
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.protocol import wire_time, wire_values

SETTINGS = ("availabilityWindows", "pricing", "isListed", "type")
MAX_WINDOWS = 64
MAX_PRICE = 1_000_000
MAX_TYPE_CHARS = 64


def settings_problem(body: Any) -> str | None:
    """Why a listing update cannot be taken, or None."""
    if not isinstance(body, dict) or not body:
        return f"body must be an object with one or more of {', '.join(SETTINGS)}"
    unknown = sorted(set(body) - set(SETTINGS))
    if unknown:
        return f"unknown field(s) {', '.join(unknown)}: a listing update takes {', '.join(SETTINGS)}"
    windows = body.get("availabilityWindows", [])
    if not isinstance(windows, list) or len(windows) > MAX_WINDOWS:
        return f"availabilityWindows must be an array of at most {MAX_WINDOWS} {{start, end}} objects"
    for index, window in enumerate(windows):
        if not isinstance(window, dict) or not all(wire_time.is_iso(window.get(key)) for key in ("start", "end")):
            return f"availabilityWindows[{index}] must have start and end, ISO 8601 date-times"
        if wire_time.parse_iso(window["start"]) >= wire_time.parse_iso(window["end"]):
            return f"availabilityWindows[{index}]: start must be before end"
    if "pricing" in body:
        price = body["pricing"].get("pricePerGpu") if isinstance(body["pricing"], dict) else None
        if not wire_values.is_number(price) or not 0 <= price <= MAX_PRICE:
            return f"pricing must be an object with pricePerGpu, a number from 0 to {MAX_PRICE} (per GPU-hour)"
    if "isListed" in body and not isinstance(body["isListed"], bool):
        return "isListed must be a boolean"
    kind = body.get("type", "on-demand")
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_TYPE_CHARS or not wire_values.is_text(kind):
        return f"type must be a string of 1 to {MAX_TYPE_CHARS} characters"
    return None


def rental_refusal(settings: dict, start: datetime, end: datetime | None) -> str | None:
    """Why what the host published refuses a rental from `start` to `end`
    (None: open-ended), or None. Not listed: refused. Windows set: the rental
    starts inside one and, if it has an end, ends inside the same one. No
    windows: the host set no limit in time."""
    if not settings.get("isListed", shapes.LISTED_BY_DEFAULT):
        return "the environment is not listed: its host has taken it off the marketplace (isListed false)"
    windows = [
        (wire_time.parse_iso(w["start"]), wire_time.parse_iso(w["end"]))
        for w in settings.get("availabilityWindows", [])
    ]
    if not windows:
        return None
    around = [(low, high) for low, high in windows if low <= start < high]
    if not around:
        coming = sorted(low for low, _high in windows if low > start)
        then = f"; the next one starts at {wire_time.iso(coming[0])}" if coming else "; none is left to come"
        return f"the environment is outside its host's availability windows now{then}"
    if end is not None and not any(end <= high for _low, high in around):
        latest = max(high for _low, high in around)
        return f"endDate is after the end of the availability window the rental starts in ({wire_time.iso(latest)})"
    return None


def routes(state: MarketplaceState) -> list[web.RouteDef]:
    store = state.store

    def own_environment(request: web.Request) -> web.Response | None:
        if request.match_info["envId"] != store.envId:
            return json_error(404, f"environment {request.match_info['envId']} not found")
        return None

    async def update_listing(request: web.Request) -> web.Response:
        if (missing := own_environment(request)) is not None:
            return missing
        body = await json_body(request)
        problem = settings_problem(body)
        if problem:
            return json_error(400, problem)
        settings = store.listingSettings
        if "availabilityWindows" in body:
            windows = body["availabilityWindows"]
            settings["availabilityWindows"] = [{"start": w["start"], "end": w["end"]} for w in windows]
        if "isListed" in body:
            settings["isListed"] = body["isListed"]
        if "type" in body:
            settings["type"] = body["type"]
        if "pricing" in body:
            price = float(body["pricing"]["pricePerGpu"])
            if settings.get("pricePerGpu") != price:
                settings["pricePerGpu"] = price
                usage.record_price(store.priceHistory, price, wire_time.iso())
        settings["updatedAt"] = wire_time.iso()
        state.changed()
        return web.json_response("listing updated")

    async def get_usage(request: web.Request) -> web.Response:
        if (missing := own_environment(request)) is not None:
            return missing
        name = request.query.get("timezone") or "UTC"
        try:
            zone = await asyncio.to_thread(ZoneInfo, name)  # it reads the zone's file
        except (ZoneInfoNotFoundError, ValueError, OSError):  # unknown, a path trick, too long
            return json_error(400, f"timezone {name[:64]!r} is not a time zone name of the IANA database")
        try:
            start, end = usage.parse_range(dict(request.query), zone)
        except ValueError as exc:
            return json_error(400, str(exc))
        summary = usage.summary(list(store.usage.values()), store.priceHistory, start, end, zone)
        return web.json_response({**summary, "pricePerGpu": store.listingSettings.get("pricePerGpu", 0.0)})

    return [
        web.patch("/v1/environments/{envId}/listing", update_listing),
        web.get("/v1/environments/{envId}/usage", get_usage),
    ]

"""What the host publishes is honoured: a rental of an
environment that is not listed, or outside its availability windows, is a 409
with the reason; a rental keeps the listing as it was when it was made."""

from __future__ import annotations

from datetime import timedelta

import aiohttp
import pytest

from gpuhost_agent.local_marketplace import server
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import wire, wire_time


@pytest.fixture
async def market():
    running = await server.start(MarketplaceState(Store.load_or_create(None)), port=0)
    store = running.state.store
    async with aiohttp.ClientSession(headers={wire.API_KEY_HEADER: store.renterApiKey}) as http:
        yield running.base_url, store, http
    await running.stop()


def _at(hours: float) -> str:
    return wire_time.iso(wire_time.utcnow() + timedelta(hours=hours))


async def _publish(http: aiohttp.ClientSession, base_url: str, env_id: str, body: dict) -> None:
    async with http.patch(f"{base_url}/environments/{env_id}/listing", json=body) as response:
        assert response.status == 200, await response.text()


async def _rent(http: aiohttp.ClientSession, base_url: str, env_id: str, **extra) -> tuple[int, dict]:
    async with http.post(f"{base_url}/rentals", json={"envId": env_id, "gpuCount": 0, **extra}) as response:
        return response.status, await response.json()


async def test_an_unlisted_environment_is_not_rented(market) -> None:
    base_url, store, http = market
    assert (await _rent(http, base_url, store.envId))[0] == 201  # listed from the start
    await _publish(http, base_url, store.envId, {"isListed": False})
    status, body = await _rent(http, base_url, store.envId)
    assert status == 409 and "not listed" in body["message"]
    assert len(store.rentals) == 1


@pytest.mark.parametrize(
    ("windows", "end", "refusal"),
    [
        ([(-1, 1)], None, None),
        ([(-1, 1)], 0.5, None),
        ([(-1, 1)], 2, "endDate is after the end of the availability window"),
        ([(1, 2)], None, "outside its host's availability windows now; the next one starts at"),
        ([(-3, -2)], None, "none is left to come"),
        ([(-3, -2), (-1, 5)], 4, None),
    ],
)
async def test_a_rental_lies_inside_an_availability_window(market, windows, end, refusal) -> None:
    base_url, store, http = market
    published = [{"start": _at(start), "end": _at(stop)} for start, stop in windows]
    await _publish(http, base_url, store.envId, {"availabilityWindows": published})
    status, body = await _rent(http, base_url, store.envId, **({"endDate": _at(end)} if end is not None else {}))
    if refusal is None:
        assert status == 201, body
    else:
        assert status == 409 and refusal in body["message"], body


async def test_a_rental_keeps_the_listing_it_was_made_on(market) -> None:
    base_url, store, http = market
    await _publish(http, base_url, store.envId, {"pricing": {"pricePerGpu": 1.0}})
    status, rental = await _rent(http, base_url, store.envId)
    assert status == 201 and rental["listing"]["pricing"]["pricePerGpu"] == 1.0
    await _publish(http, base_url, store.envId, {"pricing": {"pricePerGpu": 3.0}, "type": "spot"})
    async with http.get(f"{base_url}/rentals/{rental['rentalId']}") as response:
        later = await response.json()
    assert later["listing"] == rental["listing"]
    async with http.get(f"{base_url}/environments/{store.envId}/listing") as response:
        assert (await response.json())["pricing"]["pricePerGpu"] == 3.0

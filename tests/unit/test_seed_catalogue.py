"""The renter's catalogue and its queries, over real HTTP:
GET /environments/listings with its filters and pagination, its filters
endpoint, PATCH /environments/{envId} (name), GET /rentals?status=."""

from __future__ import annotations

import aiohttp
import pytest

from gpuhost_agent.local_marketplace import listings_api, server
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import wire

HARDWARE = {
    "totalGPUs": 4,
    "gpuName": "NVIDIA H100 80GB HBM3",
    "gpuVRAM": 80,
    "location": "Paris",
}


@pytest.fixture
async def market():
    running = await server.start(MarketplaceState(Store.load_or_create(None)), port=0)
    store = running.state.store
    store.host["report"] = {"listing": dict(HARDWARE), "reportedAt": "2026-11-27T10:00:00.000000Z"}
    async with aiohttp.ClientSession(headers={wire.API_KEY_HEADER: store.renterApiKey}) as http:
        yield running.base_url, store, http
    await running.stop()


async def _get(http: aiohttp.ClientSession, url: str, **params: str) -> tuple[int, object]:
    async with http.get(url, params=params) as response:
        return response.status, await response.json()


async def test_only_a_listed_environment_is_in_the_catalogue(market) -> None:
    base_url, store, http = market
    url = f"{base_url}/environments/{store.envId}/listing"
    status, page = await _get(http, base_url + "/environments/listings")  # listed from the start
    assert [listing["envId"] for listing in page["listings"]] == [store.envId]
    async with http.patch(url, json={"isListed": False}) as response:
        assert response.status == 200
    assert await _get(http, base_url + "/environments/listings") == (200, {"listings": []})
    async with http.patch(url, json={"isListed": True}) as response:
        assert response.status == 200
    status, page = await _get(http, base_url + "/environments/listings")
    assert status == 200
    assert [listing["envId"] for listing in page["listings"]] == [store.envId]
    assert "lastEvaluatedKey" not in page  # nothing follows


@pytest.mark.parametrize(
    ("params", "found"),
    [
        ({"gpuName": "NVIDIA H100 80GB HBM3,NVIDIA A100"}, True),
        ({"gpuName": "NVIDIA A100"}, False),
        ({"gpuVRAM": "40, 80"}, True),
        ({"gpuVRAM": "40"}, False),
        ({"location": "Paris"}, True),
        ({"location": "Lyon"}, False),
        ({"availableGPUs": "2,4"}, True),
        ({"availableGPUs": "5"}, False),
        ({"available": "true"}, True),
        ({"available": "false"}, False),
        ({"type": "on-demand"}, True),
        ({"type": "spot"}, False),
        ({"price": "2"}, True),
        ({"price": "1.5,2"}, True),
        ({"price": "1"}, False),
        ({"envId": "someone-else"}, False),
        ({"limit": "1", "lastEvaluatedKey": "0"}, True),
        ({"lastEvaluatedKey": "~"}, False),  # after every uuid
    ],
)
async def test_each_filter_picks_the_listing_or_not(market, params: dict, found: bool) -> None:
    base_url, store, http = market
    body = {"isListed": True, "pricing": {"pricePerGpu": 1.5}}
    async with http.patch(f"{base_url}/environments/{store.envId}/listing", json=body) as response:
        assert response.status == 200
    status, page = await _get(http, base_url + "/environments/listings", **params)
    assert status == 200, page
    assert len(page["listings"]) == (1 if found else 0)


@pytest.mark.parametrize(
    "params",
    [{"limit": "0"}, {"limit": "101"}, {"limit": "1.5"}, {"gpuVRAM": "1e3"}, {"price": "1,2,3"}, {"available": "yes"}],
)
async def test_an_unreadable_filter_is_a_400_naming_it(market, params: dict) -> None:
    base_url, _store, http = market
    status, body = await _get(http, base_url + "/environments/listings", **params)
    assert status == 400
    assert next(iter(params)) in body["message"]


def test_a_page_that_stops_at_its_limit_names_where_to_go_on() -> None:
    listings = [{"envId": key} for key in ("a", "b", "c")]
    first = listings_api.page(listings, {"limit": "2"})
    assert (first["listings"], first["lastEvaluatedKey"]) == (listings[:2], "b")
    second = listings_api.page(listings, {"limit": "2", "lastEvaluatedKey": "b"})
    assert second == {"listings": listings[2:]}


async def test_filters_are_the_listed_values(market) -> None:
    base_url, store, http = market
    empty = {
        "locations": [],
        "models": [],
        "types": [],
        "vrams": [],
        "availableGPUs": [],
        "minPrice": 0.0,
        "maxPrice": 0.0,
    }
    async with http.patch(f"{base_url}/environments/{store.envId}/listing", json={"isListed": False}) as response:
        assert response.status == 200
    assert await _get(http, base_url + "/environments/listings/filters") == (200, empty)
    body = {"isListed": True, "pricing": {"pricePerGpu": 2.25}, "type": "spot"}
    async with http.patch(f"{base_url}/environments/{store.envId}/listing", json=body) as response:
        assert response.status == 200
    assert await _get(http, base_url + "/environments/listings/filters") == (
        200,
        {
            "locations": ["Paris"],
            "models": ["NVIDIA H100 80GB HBM3"],
            "types": ["spot"],
            "vrams": [80],
            "availableGPUs": [4],
            "minPrice": 2.25,
            "maxPrice": 2.25,
        },
    )


async def test_the_environment_is_renamed(market) -> None:
    base_url, store, http = market
    store.host.clear()  # a partial report (the listing's hardware only) does not make an Environment
    url = f"{base_url}/environments/{store.envId}"
    async with http.patch(url, json={"name": "lab box"}) as response:
        assert (response.status, await response.json()) == (200, "environment updated")
    status, env = await _get(http, url)
    assert (status, env["name"]) == (200, "lab box")
    assert env["updatedAt"] == store.envUpdatedAt > store.createdAt
    for bad in ({"name": 3}, {"name": "x", "apiKey": "y"}, {"name": "x" * 129}):
        async with http.patch(url, json=bad) as response:
            assert response.status == 400, bad
    async with http.patch(f"{base_url}/environments/nope", json={"name": "x"}) as response:
        assert response.status == 404


async def test_rentals_are_listed_by_status(market) -> None:
    base_url, store, http = market
    active = store.create_rental(name="a", gpu_count=0, end_date=None)
    ended = store.create_rental(name="b", gpu_count=0, end_date=None)
    store.end_rental(ended["rentalId"])

    async def ids(**params: str) -> list[str]:
        status, rentals = await _get(http, base_url + "/rentals", **params)
        assert status == 200
        return [rental["rentalId"] for rental in rentals]  # type: ignore[attr-defined]

    assert await ids() == [active["rentalId"], ended["rentalId"]]
    assert await ids(status="ACTIVE") == [active["rentalId"]]
    assert await ids(status="COMPLETE") == [ended["rentalId"]]
    status, body = await _get(http, base_url + "/rentals", status="ENDED")
    assert status == 400 and "ACTIVE" in body["message"]  # type: ignore[index]


async def test_what_renters_read_counts_the_active_rentals_without_naming_them(market) -> None:
    """The catalogue and a rental's own listing say how many rentals are active,
    not their ids (other renters' rentals, and when each starts and ends); the
    environment's own listing names them."""
    base_url, store, http = market
    async with http.post(base_url + "/rentals", json={"envId": store.envId}) as response:
        assert response.status == 201
        first = (await response.json())["rentalId"]
    async with http.post(base_url + "/rentals", json={"envId": store.envId}) as response:
        assert response.status == 201
        second = await response.json()
    status, page = await _get(http, base_url + "/environments/listings")
    assert status == 200 and page["listings"][0]["activeRentalIds"] == {"rentalIds": [], "count": 2}
    assert second["listing"]["activeRentalIds"] == {"rentalIds": [], "count": 2}  # as rented, itself counted
    status, own = await _get(http, f"{base_url}/rentals/{second['rentalId']}")
    assert status == 200 and first not in str(own)
    status, listing = await _get(http, f"{base_url}/environments/{store.envId}/listing")
    assert status == 200 and listing["activeRentalIds"] == {"rentalIds": [first, second["rentalId"]], "count": 2}

"""The host's usage page and listing settings on the local marketplace,
over real HTTP, each answer checked against docs/local-marketplace-api.yaml
and each report against docs/agent-api.yaml."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from support.openapi_check import check, check_named, request_schema, response_schema

from gpuhost_agent.protocol import wire_time

SLOT = 900
USAGE_PATH = "/environments/{envId}/usage"


def _slot(day: str, hour: int, quarter: int = 0) -> str:
    moment = datetime.fromisoformat(day).replace(tzinfo=timezone.utc) + timedelta(hours=hour, minutes=15 * quarter)
    return wire_time.iso(moment)


def _report(rental_id: str, slot_start: str, **gpus: tuple[float, float, float, float]) -> dict:
    return {
        "rentalId": rental_id,
        "slotStart": slot_start,
        "slotSeconds": SLOT,
        "gpus": [
            {"uuid": uuid, "seconds": s, "busySeconds": b, "lostSeconds": lo, "offlineSeconds": off}
            for uuid, (s, b, lo, off) in gpus.items()
        ],
        "countedAt": slot_start,
    }


async def _put(market, agent_doc, body: dict) -> tuple[int, dict]:
    check(agent_doc, body, request_schema(agent_doc, "/agent/usage", "put"))
    return await market.call("PUT", "/agent/usage", body, key=market.store.envApiKey)


async def _usage(market, local_doc, query: str) -> dict:
    status, body = await market.call("GET", f"/environments/{market.store.envId}/usage?{query}")
    assert status == 200, body
    check(local_doc, body, response_schema(local_doc, USAGE_PATH, "get", 200))
    return body


async def test_a_price_set_by_the_host_values_the_hours_used_after_it(market, agent_doc, local_doc) -> None:
    env = market.store.envId
    rental = await market.rental(gpu_count=2)
    await _put(market, agent_doc, _report(rental, _slot("2026-11-20", 10), a=(900, 450, 0, 0), b=(900, 0, 0, 0)))
    patch = {"pricing": {"pricePerGpu": 2.0}, "isListed": True, "type": "on-demand"}
    check(local_doc, patch, request_schema(local_doc, "/environments/{envId}/listing", "patch"))
    status, body = await market.call("PATCH", f"/environments/{env}/listing", patch)
    assert (status, body) == (200, "listing updated")
    now = wire_time.utcnow().timestamp()
    status, _ = await _put(
        market, agent_doc, _report(rental, wire_time.iso_from_timestamp(now - now % SLOT), a=(600, 0, 0, 0))
    )
    assert status == 200

    _, listing = await market.call("GET", f"/environments/{env}/listing")
    check_named(local_doc, listing, "Listing")
    assert listing["pricing"]["pricePerGpu"] == 2.0 and listing["isListed"] is True
    today = wire_time.utcnow().date()
    page = await _usage(market, local_doc, f"from=2026-11-20&to={today.isoformat()}")
    assert page["total"]["hours"] == pytest.approx(0.5 + 600 / 3600, abs=1e-6)
    assert page["total"]["earned"] == pytest.approx(
        600 / 3600 * 2.0, abs=1e-4
    )  # the 20th's half hour was priced 0 then
    assert page["days"][0] == {**page["days"][0], "date": "2026-11-20", "count": 1, "hours": 0.5, "busyHours": 0.125}


async def test_a_report_sent_twice_or_late_counts_once(market, agent_doc, local_doc) -> None:
    rental = await market.rental(gpu_count=1)
    slot = _slot("2026-11-21", 3)
    for figures in ((300, 0, 0, 0), (600, 0, 0, 0), (600, 0, 0, 0), (300, 0, 0, 0)):  # resent, then an old one late
        status, _ = await _put(market, agent_doc, _report(rental, slot, a=figures))
        assert status == 200
    page = await _usage(market, local_doc, "from=2026-11-21&to=2026-11-21")
    assert page["total"]["hours"] == pytest.approx(600 / 3600, abs=1e-6)


async def test_days_follow_the_asked_time_zone_and_lost_or_offline_time_shows(market, agent_doc, local_doc) -> None:
    rental = await market.rental(gpu_count=1)
    # 23:45 UTC on the 21st is 05:15 on the 22nd in Kathmandu (+05:45).
    await _put(market, agent_doc, _report(rental, _slot("2026-11-21", 23, 3), a=(0, 0, 900, 0)))
    await _put(market, agent_doc, _report(rental, _slot("2026-11-21", 22, 0), a=(0, 0, 0, 900)))
    utc = await _usage(market, local_doc, "from=2026-11-21&to=2026-11-22")
    assert [d["lostHours"] for d in utc["days"]] == [0.25, 0]
    nepal = await _usage(market, local_doc, "from=2026-11-21&to=2026-11-22&timezone=Asia/Kathmandu")
    assert nepal["timezone"] == "Asia/Kathmandu"
    assert [d["lostHours"] for d in nepal["days"]] == [0, 0.25]
    assert [d["offlineHours"] for d in nepal["days"]] == [0, 0.25]  # 22:00 UTC is 03:45 next day there
    assert nepal["total"]["hours"] == 0 and nepal["total"]["rentals"][0]["lostHours"] == 0.25


async def test_percent_change_compares_with_the_period_before(market, agent_doc, local_doc) -> None:
    rental = await market.rental(gpu_count=1)
    await _put(market, agent_doc, _report(rental, _slot("2026-11-10", 0), a=(900, 0, 0, 0)))
    await _put(market, agent_doc, _report(rental, _slot("2026-11-11", 0), a=(900, 0, 0, 0)))
    await _put(market, agent_doc, _report(rental, _slot("2026-11-11", 1), a=(900, 0, 0, 0)))
    page = await _usage(market, local_doc, "from=2026-11-11&to=2026-11-11")
    assert page["percentChange"] == {"count": 0.0, "hours": 100.0, "earned": 0.0}


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"slotStart": "2026-11-21T00:05:00Z"}, "multiple of 900"),
        (
            {"gpus": [{"uuid": "a", "seconds": 901, "busySeconds": 0, "lostSeconds": 0, "offlineSeconds": 0}]},
            "0 to 900",
        ),
        ({"gpus": [{"uuid": "a", "seconds": 600, "busySeconds": 0, "lostSeconds": 600, "offlineSeconds": 0}]}, "slot"),
        ({"gpus": [{"uuid": "a", "seconds": 10, "busySeconds": 20, "lostSeconds": 0, "offlineSeconds": 0}]}, "busy"),
        ({"slotStart": "3026-11-21T00:00:00Z"}, "ahead of the marketplace's clock"),
    ],
)
async def test_a_usage_report_that_cannot_be_true_is_refused(market, body, expected) -> None:
    rental = await market.rental(gpu_count=1)
    status, answer = await market.call(
        "PUT", "/agent/usage", {**_report(rental, _slot("2026-11-21", 0)), **body}, key=market.store.envApiKey
    )
    assert status == 400 and expected in answer["message"], answer


@pytest.mark.parametrize(
    "patch, expected",
    [
        ({}, "one or more"),
        ({"price": 3}, "unknown field(s) price"),
        ({"pricing": {"pricePerGpu": -1}}, "pricePerGpu"),
        ({"availabilityWindows": [{"start": "2026-11-22T00:00:00Z", "end": "2026-11-21T00:00:00Z"}]}, "before end"),
        ({"isListed": "yes"}, "isListed"),
    ],
)
async def test_a_listing_update_names_what_is_wrong(market, patch, expected) -> None:
    status, answer = await market.call("PATCH", f"/environments/{market.store.envId}/listing", patch)
    assert status == 400 and expected in answer["message"], answer


@pytest.mark.parametrize(
    "query, expected",
    [("from=yesterday", "YYYY-MM-DD"), ("from=2025-01-01&to=2026-11-01", "366"), ("timezone=../../etc", "IANA")],
)
async def test_a_usage_query_names_what_is_wrong(market, query, expected) -> None:
    status, answer = await market.call("GET", f"/environments/{market.store.envId}/usage?{query}")
    assert status == 400 and expected in answer["message"], answer


async def test_a_host_changing_the_price_often_keeps_one_price_per_quarter_hour(market) -> None:
    for price in range(1, 50):
        status, _ = await market.call(
            "PATCH", f"/environments/{market.store.envId}/listing", {"pricing": {"pricePerGpu": price}}
        )
        assert status == 200
    assert len(market.store.priceHistory) <= 2  # two if the test crossed a slot boundary
    assert market.store.priceHistory[-1][1] == 49

"""The local marketplace's renter endpoints: shapes, and 400/401/404 errors."""

from __future__ import annotations

import pytest
from support.stacks import TEMPLATE

from gpuhost_agent.protocol import wire


async def test_missing_or_wrong_key_is_401(market):
    for key in ("", "wrong", market.store.envApiKey):  # the environment's key is not a renter key
        status, body = await market.call("GET", "/environments", key=key)
        assert status == 401 and "X-API-Key" in body["message"]
    status, _ = await market.call("GET", "/agent/jobs", key=market.store.renterApiKey)
    assert status == 401, "a renter key must not open the agent protocol"


async def test_environment_shape(market):
    status, envs = await market.call("GET", "/environments")
    assert status == 200 and len(envs) == 1
    env = envs[0]
    assert {
        "name",
        "createdAt",
        "updatedAt",
        "orgId",
        "userId",
        "envId",
        "pEnvId",
        "pEdgeKey",
        "systemData",
        "isCompliant",
        "failedComplianceReason",
        "initState",
        "hold",
        "listing",
        "apiKey",
        "heartbeat",
        "isSeed",
    } == set(env)
    status, one = await market.call("GET", f"/environments/{env['envId']}")
    assert status == 200 and one["envId"] == env["envId"]
    status, body = await market.call("GET", "/environments/nope")
    assert status == 404 and "nope" in body["message"]


async def test_rental_lifecycle(market):
    status, rental = await market.call(
        "POST",
        "/rentals",
        {"envId": market.store.envId, "name": "r1", "gpuCount": 2, "endDate": "2030-01-01T00:00:00Z"},
    )
    assert status == 201
    assert {
        "rentalId",
        "listing",
        "userId",
        "startDate",
        "endDate",
        "name",
        "status",
        "createdAt",
        "updatedAt",
        "isSeed",
    } == set(rental)
    assert rental["status"] == wire.RENTAL_ACTIVE and rental["listing"]["selectedGPUs"] == 2
    rid = rental["rentalId"]
    assert (await market.call("PATCH", f"/rentals/{rid}", {"name": "renamed"}))[0] == 200
    status, got = await market.call("GET", f"/rentals/{rid}")
    assert status == 200 and got["name"] == "renamed"
    status, listed = await market.call("GET", "/rentals")
    assert [r["rentalId"] for r in listed] == [rid]
    status, ended = await market.call("DELETE", f"/rentals/{rid}")
    assert status == 200 and ended["status"] == wire.RENTAL_COMPLETE


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({}, "envId"),
        ({"envId": "x"}, "envId"),
        ("not an object", "object"),
        ({"envId": "ENV", "gpuCount": -1}, "gpuCount"),
        ({"envId": "ENV", "gpuCount": "2"}, "gpuCount"),
        ({"envId": "ENV", "endDate": "tomorrow"}, "endDate"),
    ],
)
async def test_create_rental_rejects_bad_bodies(market, body, fragment):
    if isinstance(body, dict) and body.get("envId") == "ENV":
        body["envId"] = market.store.envId
    status, error = await market.call("POST", "/rentals", body)
    assert status in (400, 404) and fragment in error["message"]


async def test_create_stack_errors(market):
    status, rental = await market.call("POST", "/rentals", {"envId": market.store.envId})
    rid = rental["rentalId"]
    status, body = await market.call("POST", "/rentals/no-such-rental/stacks", {"template": TEMPLATE})
    assert status == 404 and "no-such-rental" in body["message"]
    bad_templates = [
        (None, "template"),
        ({"template": "x"}, "object"),
        ({"template": {**TEMPLATE, "content": 5}}, "content"),
        ({"template": {k: v for k, v in TEMPLATE.items() if k != "description"}}, "description"),
        ({"template": {k: v for k, v in TEMPLATE.items() if k != "environmentVariables"}}, "environmentVariables"),
        ({"template": {**TEMPLATE, "environmentVariables": [["A", "b"]]}}, "environmentVariables"),
        ({"template": {**TEMPLATE, "environmentVariables": {"A": 1}}}, "environmentVariables.A"),
        ({"template": {**TEMPLATE, "isSSHEnabled": "yes"}}, "isSSHEnabled"),
    ]
    for body, fragment in bad_templates:
        status, error = await market.call("POST", f"/rentals/{rid}/stacks", body)
        assert status == 400 and fragment in error["message"], (body, error)
    status, error = await market.call("POST", f"/rentals/{rid}/stacks", raw=b"{not json")
    assert status == 400 and "JSON" in error["message"]
    status, stack_id = await market.call("POST", f"/rentals/{rid}/stacks", {"template": TEMPLATE})
    assert status == 201 and isinstance(stack_id, str)
    stack = (await market.call("GET", f"/rentals/{rid}/stacks"))[1][0]
    assert stack["status"] == wire.APPLYING and stack["template"]["insecure"] is False


async def test_unknown_stack_and_container_paths_are_404(market):
    status, rental = await market.call("POST", "/rentals", {"envId": market.store.envId})
    rid = rental["rentalId"]
    for method, path in [
        ("GET", "/rentals/nope"),
        ("GET", "/rentals/nope/stacks"),
        ("DELETE", f"/rentals/{rid}/stacks/nope"),
        ("GET", f"/rentals/{rid}/stacks/nope/containers"),
        ("GET", "/no/such/path"),
    ]:
        status, body = await market.call(method, path)
        assert status == 404 and body["message"], (method, path)

"""Every operation of the seed's endpoint table gets its documented answer from
the local marketplace, over real HTTP against the server
`gpuhost-agent run` starts.

The table is parsed from the seed (`shared/spec/marketplace-api.md`, section
"Operations with a shown shape"), through its verbatim copy in
tests/fixtures/seed-endpoints.md: `shared/` lies outside the repository, so CI's
fresh clone has only the copy; where the spec is at hand the copy must equal it.

An operation is either served (a valid request gets the success status the
test expects, never the router's 404 or 405) or belongs to the marketplace
alone (501 with the one documented body). Each operation of the table must be
named in exactly one of the two sets below, so a seed that grows an operation
fails here until someone decides which it is.
"""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import asyncssh
import pytest
from support.openapi_check import check, response_schema

from gpuhost_agent.local_marketplace import server
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import wire, wire_jobs

ROOT = Path(__file__).resolve().parents[2]
COPY = ROOT / "tests" / "fixtures" / "seed-endpoints.md"
SPEC_NAME = Path("shared", "spec", "marketplace-api.md")
SECTION = "### Operations with a shown shape"

# Served: operation -> the success status of a valid request (body below, if any).
SERVED = {
    "Create stack": 201,
    "Update environment listing": 200,
    "Get environment listing": 200,
    "Update environment": 200,
    "List environments": 200,
    "Get environment installation script": 200,
    "Get environment usage": 200,
    "Get listing filters": 200,
    "Get environment listings": 200,
    "Get rental": 200,
    "Update rental": 200,
    "List stacks": 200,
    "List containers": 200,
    "Get current user": 200,
    "Create SSH key": 200,
}
MARKETPLACE_ONLY = {
    "Update custom template",
    "Create custom template",
    "List custom templates",
    "Delete environment",
    "Get favorite status",
    "Set favorite",
    "Remove favorite",
    "Create rental checkout session",
    "Create API key",
    "List API keys",
    "Delete API key",
    "Update user notification status",
    "Delete user notification",
    "Get notifications by status",
    "Get user redirect URL",
}
TEMPLATE = {"name": "web", "description": "", "content": "services: {}\n", "environmentVariables": {}}
PUBLIC_KEY = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip() + " renter@laptop"
BODIES = {
    "Create stack": {"template": TEMPLATE},
    "Update environment listing": {"isListed": True, "pricing": {"pricePerGpu": 1.5}},
    "Update environment": {"name": "renamed"},
    "Update rental": {"name": "renamed"},
    "Create SSH key": {"publicKey": PUBLIC_KEY},
}


def table_lines(text: str) -> list[str]:
    """The table's lines (header and separator included) of the section."""
    section = text.split(SECTION, 1)[1].split("\n### ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def operations(lines: list[str]) -> list[tuple[str, str, str]]:
    """(operation, method, path) of each row."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return [(row[0], row[1], row[2]) for row in rows]


def find_spec() -> Path | None:
    """shared/ beside the project's directory (or beside a parent: a worktree's)."""
    for parent in ROOT.parents:
        if (parent / SPEC_NAME).is_file():
            return parent / SPEC_NAME
    return None


SEED = operations(table_lines(COPY.read_text()))
# Not answered as the seed says yet: strict, so each fix must take its names out.
NOT_YET: set[str] = set()
CASES = [pytest.param(*op, id=op[0], marks=[pytest.mark.xfail(strict=True)] if op[0] in NOT_YET else []) for op in SEED]


def test_the_copy_is_the_seeds_table() -> None:
    lines = table_lines(COPY.read_text())
    assert lines[0] == "| Operation | Method | Path | Request | Response |"
    assert len(SEED) == 30
    spec = find_spec()
    if spec is None:
        pytest.skip("shared/spec/marketplace-api.md is not beside this checkout (a fresh clone): the copy stands")
    assert lines == table_lines(spec.read_text()), f"tests/fixtures/seed-endpoints.md is not {spec}'s table"


def test_every_operation_is_decided() -> None:
    names = [name for name, _method, _path in SEED]
    assert sorted(names) == sorted(set(SERVED) | MARKETPLACE_ONLY)
    assert not set(SERVED) & MARKETPLACE_ONLY


@pytest.fixture
async def marketplace():
    """The real server on a free port, with one rental and one stack in it."""
    running = await server.start(MarketplaceState(Store.load_or_create(None)), port=0)
    store = running.state.store
    rental = store.create_rental(name="r", gpu_count=0, end_date=None)
    stack = store.create_stack(rental["rentalId"], wire_jobs.validate_template(TEMPLATE))
    ids = {
        "envId": store.envId,
        "rentalId": rental["rentalId"],
        "stackId": stack["stackId"],
        "templateId": "3f2504e0-4f89-11d3-9a0c-0305e82c3301",
        "apiKeyId": "key-1",
        "notificationId": "notification-1",
        "status": "unread",
    }
    headers = {wire.API_KEY_HEADER: store.renterApiKey}
    async with aiohttp.ClientSession(headers=headers) as http:
        yield running.base_url, ids, http
    await running.stop()


def _url(base_url: str, path: str, ids: dict) -> str:
    return base_url + re.sub(r"\{(\w+)\}", lambda m: ids[m.group(1)], path)


@pytest.mark.parametrize(("name", "method", "path"), CASES)
async def test_each_seed_operation_gets_its_documented_answer(
    marketplace, local_doc: dict, name: str, method: str, path: str
) -> None:
    base_url, ids, http = marketplace
    async with http.request(method, _url(base_url, path, ids), json=BODIES.get(name)) as response:
        body = await response.json()
    operation = local_doc["paths"][path][method.lower()]
    check(local_doc, body, response_schema(local_doc, path, method.lower(), response.status))
    assert ("marketplace-only" in operation["tags"]) == (name in MARKETPLACE_ONLY), "the document says which is which"
    if name in MARKETPLACE_ONLY:
        assert response.status == 501, body
        assert body == {
            "status": 501,
            "message": f"{name} is served by the marketplace, not by the local marketplace",
        }
    else:
        assert response.status == SERVED[name], body


async def test_a_method_a_served_path_does_not_take_is_405_with_allow(marketplace) -> None:
    base_url, ids, http = marketplace
    async with http.put(_url(base_url, "/environments/{envId}/listing", ids)) as response:
        body = await response.json()
        assert response.status == 405, body
        assert set(response.headers["Allow"].split(",")) >= {"GET", "PATCH"}
        assert body["status"] == 405


async def test_a_literal_path_allows_its_own_methods_not_its_variable_neighbours(marketplace) -> None:
    """/rentals/checkout is also a /rentals/{rentalId}: without its own catch-all,
    GET would look up a rental named "checkout" and Allow would list the rental's methods."""
    base_url, _ids, http = marketplace
    for method in ("GET", "OPTIONS", "PATCH"):
        async with http.request(method, base_url + "/rentals/checkout") as response:
            assert response.status == 405, await response.text()
            assert response.headers["Allow"] == "POST"

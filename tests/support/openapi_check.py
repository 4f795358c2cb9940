"""Shared support for the tests that keep docs/agent-api.yaml and
docs/local-marketplace-api.yaml in step with the code: test_api_docs.py (the stack
and job protocol, the renter API) and test_api_docs_machine.py (the machine reports).

Here: loading the two documents (the fixtures agent_doc and local_doc in
tests/conftest.py hand them to the tests), following local $refs, strict
validation against their schemas, the operations documented and served. The
stand-ins both test modules use are in support.fakes, the sample machine
payloads in support.machine_samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml

from gpuhost_agent.local_marketplace.server import build_app
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store

DOCS = Path(__file__).resolve().parents[2] / "docs"
AGENT_DOC = DOCS / "agent-api.yaml"
LOCAL_DOC = DOCS / "local-marketplace-api.yaml"
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "options", "head", "trace"}
AGENT_PREFIX = "/v1/agent/"


# ---- helpers ----------------------------------------------------------------------


def load(path: Path) -> dict:
    """The document, read by libyaml's safe loader (the pure-Python one takes
    0.4 s a document, and every test worker reads both)."""
    return yaml.load(path.read_text(), Loader=yaml.CSafeLoader)  # noqa: S506 - the safe loader, in C


def documented_operations(doc: dict) -> set[tuple[str, str]]:
    """(METHOD, /v1-prefixed path) for every operation in the document."""
    return {
        (method.upper(), "/v1" + path)
        for path, item in doc["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


async def served_operations() -> set[tuple[str, str]]:
    """(METHOD, path) of every route of the local marketplace (HEAD left out: aiohttp adds it to every GET;
    "*" too: a catch-all answers the 405 of a path's other methods)."""
    app = build_app(MarketplaceState(Store.load_or_create(None)))
    return {
        (route.method, route.resource.canonical) for route in app.router.routes() if route.method not in ("HEAD", "*")
    }


def schema(doc: dict, name: str) -> dict:
    return doc["components"]["schemas"][name]


def _strict(node: Any) -> Any:
    """A copy in which object schemas allow no property they do not list, so that
    a field the code emits but the document does not describe fails validation.
    (The documents themselves leave objects open: the protocol grows additively.)"""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items()}
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def check(doc: dict, instance: Any, target: dict) -> None:
    """Validate instance against a schema of doc (refs resolved within doc), strictly."""
    root = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "allOf": [_strict(target)],
        "components": _strict(doc["components"]),
    }
    jsonschema.Draft202012Validator(root).validate(instance)


def check_named(doc: dict, instance: Any, name: str) -> None:
    check(doc, instance, {"$ref": f"#/components/schemas/{name}"})


def resolve(doc: dict, node: dict) -> dict:
    """Follow a local $ref (#/components/...) to its target."""
    while "$ref" in node:
        target: Any = doc
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def response_schema(doc: dict, path: str, method: str, status: int | str) -> dict:
    response = resolve(doc, doc["paths"][path][method]["responses"][str(status)])
    return response["content"]["application/json"]["schema"]


def request_schema(doc: dict, path: str, method: str) -> dict:
    return doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]


async def answer(doc: dict, response, path: str, method: str) -> Any:
    """The JSON body of response, checked against the document's schema for its status."""
    body = await response.json()
    check(doc, body, response_schema(doc, path, method, response.status))
    return body


def properties(doc: dict, name: str) -> set[str]:
    return set(schema(doc, name)["properties"])

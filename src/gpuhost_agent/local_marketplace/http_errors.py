"""JSON errors with a human-readable message, the same shape on every endpoint,
and the one comparison of a secret a client sent."""

from __future__ import annotations

import hmac
import json
import time
from typing import Any

from aiohttp import web

from gpuhost_agent.errors import Refusal
from gpuhost_agent.protocol import wire_time

MAX_BODY_BYTES = 1024 * 1024
# How far ahead of the marketplace's clock a report may be dated. A report
# from the future would make every later, real one look stale and be dropped.
MAX_AHEAD_SECONDS = 300


class BadRequest(Refusal):
    pass


def json_error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"status": status, "message": message, **extra}, status=status)


def other_methods(path: str, methods: tuple[str, ...]) -> web.RouteDef:
    """A catch-all registered after a literal path's own routes: 405 whose Allow
    names that path's methods only. Without it a literal path that a served
    path's variable also matches (/rentals/checkout and /rentals/{rentalId})
    gets a 405 listing both paths' methods, or is looked up as an id."""
    allowed = methods + (("HEAD",) if "GET" in methods else ())

    async def handler(request: web.Request) -> web.Response:
        answer = json_error(405, f"{request.method} is not a method of {path}: it takes {', '.join(methods)}")
        answer.headers["Allow"] = ",".join(allowed)
        return answer

    return web.route("*", path, handler)


async def json_body(request: web.Request) -> Any:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise BadRequest(f"body larger than {MAX_BODY_BYTES} bytes")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:  # a chunked body past aiohttp's own cap: the same answer as any other
        raise BadRequest(f"body larger than {MAX_BODY_BYTES} bytes") from None
    if len(raw) > MAX_BODY_BYTES:
        raise BadRequest(f"body larger than {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(raw or b"null", parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("body is nested too deeply") from None


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON; taken, they would be served on as invalid JSON."""
    raise ValueError(f"{name} is not a JSON number")


def same_secret(given: str | None, expected: str) -> bool:
    """In constant time, whatever the client sent: header, query and cookie
    values that are not UTF-8 reach us as surrogates, and hmac refuses str
    with non-ASCII characters; compared as the bytes sent, they are simply
    not the secret (a 401), never an exception (a 500)."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape"))


def too_far_ahead(key: str, value: str) -> str | None:
    """The problem with a report time (already a valid date-time) dated more
    than MAX_AHEAD_SECONDS after the marketplace's own clock."""
    ahead = wire_time.parse_iso(value).timestamp() - time.time()
    if ahead <= MAX_AHEAD_SECONDS:
        return None
    return (
        f"{key} is {ahead:.0f} s ahead of the marketplace's clock (at most {MAX_AHEAD_SECONDS} s): "
        "report times come from a synchronised clock"
    )

"""JSON errors with a human-readable message, the same shape on every endpoint."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

MAX_BODY_BYTES = 1024 * 1024


class BadRequest(Exception):
    pass


def json_error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"status": status, "message": message, **extra}, status=status)


async def json_body(request: web.Request) -> Any:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise BadRequest(f"body larger than {MAX_BODY_BYTES} bytes")
    raw = await request.read()
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

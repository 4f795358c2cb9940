"""Errors aiohttp answers before any handler runs, in the same JSON shape as
every other error.

A request line or header over 8 KiB, too many headers, bytes that are not
HTTP, or an exception no handler caught: aiohttp answers those itself, from
its connection handler, with a plain-text body (and for a parse error, the
client's own bytes echoed in it). No middleware or signal sees them. A
client of a JSON API must not need a second error format for them, so the
connection handler's `handle_error` is the one place they are turned into
`{"status", "message"}`; aiohttp still logs them and still closes the
connection. aiohttp offers no public hook for this: the server class is
swapped for a subclass right after the runner made it (the subclass adds no
state), and tests/unit/test_parse_errors.py sends such requests with curl,
so an aiohttp upgrade that changes this is caught.
"""

from __future__ import annotations

import re
from http import HTTPStatus

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

MESSAGE_CHARS = 200
# aiohttp's parse errors end by quoting what the client sent ("... when
# reading: b'aaaa...'"): anything, and not the client's to have echoed back.
_QUOTED_BYTES = re.compile(r":?\s*(bytearray\()?b['\"].*$")


class _JsonErrorHandler(RequestHandler):
    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        super().handle_error(request, status, exc, message)  # logs it; refuses when a response already began
        response = web.json_response({"status": status, "message": describe(status, message)}, status=status)
        response.force_close()
        return response


class _JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        handler = super().__call__()
        handler.__class__ = _JsonErrorHandler
        return handler


def describe(status: int, message: str | None) -> str:
    """The status's phrase, and for a client error the parser's first line
    without the bytes it quotes, cut short; a 5xx says nothing of the
    server's insides."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    text = (message or "").strip()
    first = _QUOTED_BYTES.sub("", text.splitlines()[0]).strip(" .:") if text else ""
    if status >= 500 or not first:
        return phrase
    if len(first) > MESSAGE_CHARS:
        first = first[:MESSAGE_CHARS] + "..."
    return f"{phrase}: {first}"


class JsonErrorsRunner(web.AppRunner):
    """web.AppRunner whose connections answer aiohttp's own errors in JSON."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer
        return server

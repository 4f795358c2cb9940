"""Speed-test endpoints under /v1/agent/speedtest, for measuring a host's link to the marketplace.

The agent measures its bandwidth against the marketplace itself, never a third
party: it downloads a bounded number of incompressible bytes from here and
uploads a bounded body here. Upload speed is timed on this side, where the bytes
arrive. Authentication is the application's middleware's job, not this module's.
"""

from __future__ import annotations

import os
import time

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gpuhost_agent.local_marketplace.http_errors import json_error

DEFAULT_DOWNLOAD_BYTES = 25_000_000
MAX_DOWNLOAD_BYTES = 200_000_000
MAX_UPLOAD_BYTES = 200_000_000
CHUNK_BYTES = 256 * 1024
# Random, so that no compressing proxy or link can make the link look faster than it is.
_BLOCK = os.urandom(CHUNK_BYTES)

# The client hanging up while we write or read: normal for a speed test that stops early.
# ConnectionError covers ConnectionResetError, aiohttp's ClientConnectionResetError
# ("Cannot write to closing transport") and the bare "Connection lost" from drain().
_CLIENT_GONE = (ConnectionError, getattr(aiohttp, "ClientConnectionResetError", ConnectionResetError))


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/agent/speedtest/download", download),
        web.post("/v1/agent/speedtest/upload", upload),
    ]


async def download(request: web.Request) -> web.StreamResponse:
    """Stream `bytes` incompressible bytes (clamped to MAX_DOWNLOAD_BYTES)."""
    raw = request.query.get("bytes", str(DEFAULT_DOWNLOAD_BYTES))
    try:
        wanted = int(raw)
    except ValueError:
        return json_error(400, f"bytes must be a positive integer, got {raw!r}")
    if wanted <= 0:
        return json_error(400, f"bytes must be a positive integer, got {wanted}")
    total = min(wanted, MAX_DOWNLOAD_BYTES)
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream", "Cache-Control": "no-store"})
    response.content_length = total
    try:
        await response.prepare(request)
        left = total
        while left > 0:
            piece = _BLOCK if left >= CHUNK_BYTES else _BLOCK[:left]
            await response.write(piece)
            left -= len(piece)
        await response.write_eof()
    except _CLIENT_GONE:
        pass  # the agent stopped reading (its time bound): nothing to report
    return response


async def upload(request: web.Request) -> web.Response:
    """Read and discard the body; answer how many bytes came and over how many seconds."""
    limit = MAX_UPLOAD_BYTES
    if request.content_length is not None and request.content_length > limit:
        return json_error(413, f"speed-test upload larger than {limit} bytes")
    received = 0
    # From the request's arrival (headers read) to the last body byte: timing from
    # the first chunk would count that chunk's bytes without its time.
    started = last = time.monotonic()
    try:
        async for chunk in request.content.iter_chunked(CHUNK_BYTES):
            last = time.monotonic()
            received += len(chunk)
            if received > limit:
                return json_error(413, f"speed-test upload larger than {limit} bytes")
    except (*_CLIENT_GONE, HttpProcessingError, aiohttp.ClientPayloadError):
        return json_error(400, "speed-test upload ended before its body was complete")
    seconds = last - started
    return web.json_response({"receivedBytes": received, "seconds": seconds})

"""An HTTP reply's body read up to a cap and no further, for the two
adapters whose peers may send more than the agent should hold: the
marketplace (uplink/replies.py) and the Docker Engine, whose inspect
answers carry what a renter's image configured (runtime/engine/calls.py).
Each says "too large" with its own error.
"""

from __future__ import annotations

import aiohttp


async def read_up_to(response: aiohttp.ClientResponse, cap: int) -> bytes | None:
    """The body, or None when it is longer than `cap` bytes, by its
    Content-Length or by what actually arrives (after decompression)."""
    if response.content_length is not None and response.content_length > cap:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await response.content.read(cap + 1 - size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > cap:
            return None

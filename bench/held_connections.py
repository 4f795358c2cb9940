"""The held-connections row of bench/tunnel.py: N clients connected through one
tunnel at once, each with half a request sent (so the service keeps it open),
while new requests still have to be answered.

It reports how long opening them all took, how many were still held after the
marketplace's 5 s head timeout (a connection the agent refused gets a 502 page
by then), the resident memory of the marketplace and the agent together (both
ends of every relay) before and while they are held, and the latency of new requests before and while they are held.
"""

from __future__ import annotations

import asyncio
import resource
import time

HALF_REQUEST = b"GET /small HTTP/1.1\r\nHost: bench\r\n"  # no blank line: the service waits for more
SETTLE_SECONDS = 6.0  # past the marketplace's 5 s wait for a refused client's request head


def enough_descriptors(count: int) -> None:
    """Every held connection is about six sockets: raise the limit before the
    agent's process starts, so that it inherits it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count * 8:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count * 8), hard))


async def hold(host: str, port: int, count: int) -> tuple[list[tuple], float, int]:
    """(the connections, seconds to open them all, how many are still held)."""
    started = time.perf_counter()
    pairs = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(HALF_REQUEST)
        pairs.append((reader, writer))
    await asyncio.gather(*(w.drain() for _, w in pairs), return_exceptions=True)
    opened = time.perf_counter() - started
    await asyncio.sleep(SETTLE_SECONDS)
    held = 0
    for reader, _ in pairs:
        try:
            answered = await asyncio.wait_for(reader.read(1), 0.001)
        except asyncio.TimeoutError:
            held += 1  # nothing came back: the service is still waiting for the rest
            continue
        held += 0 if answered or reader.at_eof() else 1
    return pairs, opened, held


async def release(pairs: list[tuple]) -> None:
    for _, writer in pairs:
        writer.close()
    await asyncio.gather(*(w.wait_closed() for _, w in pairs), return_exceptions=True)

"""The terminal-echo row of bench/tunnel.py: how fast a keystroke comes back
in a terminal while the same renter downloads a large file through a tunnel.

The terminal runs `cat` on a TTY, so the line discipline echoes each byte at
once; a keystroke's time is from sending it on the terminal's WebSocket to
seeing it come back. Measured idle, then while curl pulls the big file
through the tunnel in a loop: each stream has its own WebSocket (TCP's flow
control paces the download apart), so the echo should not wait behind the
download's bytes. Goal: p99 under 50 ms during the transfer.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time

import aiohttp


async def open_terminal(http: aiohttp.ClientSession, store, rental_id: str, stack_id: str) -> str:
    """The terminal's single-use ws:// URL, running `cat` in the stack's first container."""
    container = store.containers[stack_id]["containers"][0]["Id"]
    path = f"rentals/{rental_id}/stacks/{stack_id}/containers/{container}/terminal"
    async with http.post(path, json={"command": ["cat"]}) as resp:
        resp.raise_for_status()
        return (await resp.json())["url"]


async def _echo_ms(ws: aiohttp.ClientWebSocketResponse, key: bytes) -> float:
    started = time.perf_counter()
    await ws.send_bytes(key)
    seen = b""
    while key not in seen:
        message = await ws.receive(timeout=10)
        if message.type != aiohttp.WSMsgType.BINARY:
            raise RuntimeError(f"the terminal ended: {message.type} {message.data!r}")
        seen += message.data
    return (time.perf_counter() - started) * 1000


async def echoes(ws: aiohttp.ClientWebSocketResponse, count: int) -> list[float]:
    times = []
    for index in range(count):
        times.append(await _echo_ms(ws, bytes([ord("a") + index % 26])))
        await asyncio.sleep(0.01)  # a fast typist, not a flood
    return times


def _download_loop(url: str, stop: threading.Event, done: list[int]) -> None:
    while not stop.is_set():
        subprocess.run(["curl", "-sS", "-o", "/dev/null", "--max-time", "120", url], check=False, timeout=130)
        done.append(1)


async def measure(http: aiohttp.ClientSession, store, rental_id: str, stack_id: str, big_url: str, count: int):
    """(idle echo ms, echo ms during the download, downloads finished meanwhile)."""
    url = await open_terminal(http, store, rental_id, stack_id)
    async with aiohttp.ClientSession() as plain, plain.ws_connect(url) as ws:
        await echoes(ws, 5)  # the exec is up and the first echo paid for
        idle = await echoes(ws, count)
        stop, done = threading.Event(), []
        downloader = threading.Thread(target=_download_loop, args=(big_url, stop, done), daemon=True)
        downloader.start()
        await asyncio.sleep(0.5)  # the download is at full speed
        try:
            busy = await echoes(ws, count)
        finally:
            stop.set()
            await asyncio.to_thread(downloader.join, 130)
    return idle, busy, len(done)

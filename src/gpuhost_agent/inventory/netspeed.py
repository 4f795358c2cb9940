"""The host's network download and upload speed, measured against the marketplace only.

Why the marketplace and never a third-party speed-test service: the figure
renters care about is how fast this host exchanges data with the marketplace's
side of the internet, the agent must not talk to hosts nobody configured, and
the measurement must not depend on an outside service staying up and free.

Why bounded: a host may sit on a metered or slow link, so each direction sends
at most `max_bytes` and reads or writes for at most `max_seconds`; each
direction as a whole (connecting included) is given up after max_seconds + 15 s.

Rules for the figures (Mbit/s = 10^6 bits per second, rounded to 0.1):
- download: bytes read / seconds from the response headers' arrival to the last
  byte read, so the time to first byte (latency, server setup) is excluded;
- upload: the marketplace's own receivedBytes / seconds, timed where the bytes
  arrive (from the request's arrival to its last body byte); the agent's own elapsed time is used
  only when the marketplace reports 0 s.
Network failures never raise: the direction that failed gets None and `error`
says why in a few words (e.g. "download: HTTP 404").

Why a marketplace on this very machine gives no figures: its bytes never
leave the host (loopback, or the host's own address, which the kernel routes
over loopback too), so the figure says how fast the host copies memory, not
its network. Which machine the marketplace is comes from its name as resolved
(the same lookup the connection makes), not from a connection's sockets,
which aiohttp may already have released. The transfer still runs (it tests
the endpoints), but `as_wire` publishes null speeds and says why in `error`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

import aiohttp
import psutil
from yarl import URL

from gpuhost_agent.errors import OutsideFailure
from gpuhost_agent.protocol import wire_time

CHUNK_BYTES = 256 * 1024
_BLOCK = os.urandom(CHUNK_BYTES)  # incompressible, made once
_GRACE_SECONDS = 15.0


@dataclass(frozen=True)
class SpeedResult:
    download_mbps: float | None
    upload_mbps: float | None
    download_bytes: int
    upload_bytes: int
    measured_at: str
    error: str | None = None
    same_machine: str | None = None  # the marketplace's address when it is this machine


class _HttpStatus(OutsideFailure):
    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.status = status


def _mbps(nbytes: int, seconds: float) -> float | None:
    if nbytes <= 0 or seconds <= 0:
        return None
    return round(nbytes * 8 / seconds / 1e6, 1)


async def measure_speed(
    http: aiohttp.ClientSession, base_url: str, *, max_bytes: int, max_seconds: float
) -> SpeedResult:
    """Download then upload at most max_bytes each, for at most max_seconds each.

    `base_url` is the marketplace API root (".../v1"); `http` carries the auth header.
    """
    measured_at = wire_time.iso()
    base = base_url.rstrip("/")
    limit = max_seconds + _GRACE_SECONDS
    here = await marketplace_on_this_machine(base)
    down_mbps, down_bytes, down_error = await _guarded("download", _download(http, base, max_bytes, max_seconds), limit)
    up_mbps, up_bytes, up_error = await _guarded("upload", _upload(http, base, max_bytes, max_seconds), limit)
    errors = [e for e in (down_error, up_error) if e]
    return SpeedResult(
        down_mbps,
        up_mbps,
        down_bytes,
        up_bytes,
        measured_at,
        "; ".join(errors) or None,
        here,
    )


def as_wire(result: SpeedResult) -> dict:
    """systemData's networkSpeed; a same-machine measurement is no speed of the host's network."""
    upload, download, error = result.upload_mbps, result.download_mbps, result.error
    if result.same_machine is not None and (upload is not None or download is not None):
        upload = download = None
        error = (
            f"not published: the marketplace is on this machine ({result.same_machine}), so the bytes "
            f"never crossed the network (measured {_show(result.download_mbps)} down, "
            f"{_show(result.upload_mbps)} up)" + (f"; {result.error}" if result.error else "")
        )
    return {
        "uploadMbps": upload,
        "downloadMbps": download,
        "measuredAt": result.measured_at,
        "bytesDown": result.download_bytes,
        "bytesUp": result.upload_bytes,
        "error": error,
    }


def _show(mbps: float | None) -> str:
    return "nothing" if mbps is None else f"{mbps:g} Mbit/s"


def same_machine(address: str, own_addresses: set[str]) -> bool:
    """A connection to `address` stays on this host: it is a loopback address,
    or one of the host's own (which the kernel routes over loopback too)."""
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return parsed.is_loopback or str(parsed) in own_addresses


async def marketplace_on_this_machine(base_url: str) -> str | None:
    """The address the marketplace resolves to when it is this machine, else None
    (and None when the name does not resolve: the transfer then says why)."""
    url = URL(base_url)
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(url.host, url.port, type=socket.SOCK_STREAM), _GRACE_SECONDS
        )
    except (OSError, UnicodeError, asyncio.TimeoutError):
        return None
    own = await asyncio.to_thread(_own_addresses)
    return next((str(info[4][0]) for info in infos if same_machine(str(info[4][0]), own)), None)


def _own_addresses() -> set[str]:
    return {
        address.address.split("%", 1)[0]
        for addresses in psutil.net_if_addrs().values()
        for address in addresses
        if address.family in (socket.AF_INET, socket.AF_INET6)
    }


async def _guarded(
    name: str, work: Awaitable[tuple[float | None, int]], limit: float
) -> tuple[float | None, int, str | None]:
    try:
        mbps, nbytes = await asyncio.wait_for(work, limit)
    except _HttpStatus as exc:
        return None, 0, f"{name}: HTTP {exc.status}"
    except asyncio.TimeoutError:
        return None, 0, f"{name}: no answer within {limit:g} s"
    except aiohttp.ClientConnectorError:
        return None, 0, f"{name}: marketplace did not answer"
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, ConnectionError):
        return None, 0, f"{name}: connection to the marketplace was lost"
    except (aiohttp.ContentTypeError, ValueError, KeyError, TypeError):
        return None, 0, f"{name}: marketplace answered an unexpected body"
    except (aiohttp.ClientError, OSError) as exc:
        return None, 0, f"{name}: {type(exc).__name__}: {exc}"[:200]
    if mbps is None:
        return None, nbytes, f"{name}: too few bytes to time"
    return mbps, nbytes, None


async def _download(
    http: aiohttp.ClientSession, base: str, max_bytes: int, max_seconds: float
) -> tuple[float | None, int]:
    async with http.get(
        f"{base}/agent/speedtest/download", params={"bytes": str(max_bytes)}, headers={"Accept-Encoding": "identity"}
    ) as resp:
        if resp.status != 200:
            raise _HttpStatus(resp.status)
        start = time.monotonic()
        deadline = start + max_seconds
        received = 0
        while received < max_bytes:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                chunk = await asyncio.wait_for(resp.content.readany(), left)
            except asyncio.TimeoutError:
                break
            if not chunk:
                break
            received += len(chunk)
        elapsed = time.monotonic() - start
        if not resp.content.at_eof():
            resp.close()  # stopped by the time bound: drop the connection, don't drain it
    return _mbps(received, elapsed), received


async def _upload(
    http: aiohttp.ClientSession, base: str, max_bytes: int, max_seconds: float
) -> tuple[float | None, int]:
    async def body() -> AsyncIterator[bytes]:
        sent = 0
        deadline = time.monotonic() + max_seconds
        while sent < max_bytes and time.monotonic() < deadline:
            piece = _BLOCK if max_bytes - sent >= CHUNK_BYTES else _BLOCK[: max_bytes - sent]
            sent += len(piece)
            yield piece

    start = time.monotonic()
    async with http.post(
        f"{base}/agent/speedtest/upload", data=body(), headers={"Content-Type": "application/octet-stream"}
    ) as resp:
        if resp.status != 200:
            raise _HttpStatus(resp.status)
        answer = await resp.json()
    elapsed = time.monotonic() - start
    received = int(answer["receivedBytes"])
    seconds = float(answer["seconds"])
    return _mbps(received, seconds if seconds > 0 else elapsed), received

"""Host names as a browser resolves them, for aiohttp clients standing for one.

Browsers (and curl) take every `<name>.localhost` for the loopback without
asking DNS; glibc does not here. A basic-auth tunnel of the local marketplace
is reached under a name of its own, `<tunnel id>.localhost`
(local_marketplace/tunnels/auth.py host_name), so a test's browser resolves
those names as a browser does, and every other name as usual.
"""

from __future__ import annotations

import socket
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver


class BrowserNames(AbstractResolver):
    def __init__(self) -> None:
        self._default = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host == "localhost" or host.endswith(".localhost"):
            return [
                ResolveResult(
                    hostname=host,
                    host="127.0.0.1",
                    port=port,
                    family=socket.AF_INET,
                    proto=0,
                    flags=socket.AI_NUMERICHOST,
                )
            ]
        return await self._default.resolve(host, port, family)

    async def close(self) -> None:
        await self._default.close()


def browser_session(**options: Any) -> aiohttp.ClientSession:
    """An aiohttp session that resolves `*.localhost` as browsers do."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=BrowserNames()), **options)

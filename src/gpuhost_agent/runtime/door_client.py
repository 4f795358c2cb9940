"""The engine of another machine of a Swarm environment, as its agent's door
serves it to the leader (streams/node_proxy.py, docs/swarm.md).

A container's inspect, log and execs go through the door as the engine's own
API, so this is an EngineStreams whose address is the door and whose
requests carry the environment's key. What is not in the engine's API is
done by the agent on that machine, where the container's processes and
network are: a tunnel's last hop, SFTP's file helper, and the hang-up or
signal of an exec. These cannot be done from the leader: the pids an engine
reports are its own machine's, and a stack's overlay addresses are reachable
only from inside its containers' namespaces.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.parse
from collections.abc import Callable

import aiohttp

from gpuhost_agent.runtime.container_files import ContainerFiles
from gpuhost_agent.runtime.engine import EngineError
from gpuhost_agent.runtime.engine_streams import EngineStreams, EngineUnreachable, checked_id

TIMEOUT = 10.0
DISK_SECONDS = 40.0  # `GET /system/df` there may take its engine's 35 s on a big host
# How the door says why a tunnel's last hop failed (its messages start so):
# the tunnel tells a service still starting from one that is not HTTPS.
SERVICE_REFUSED = "the service refused the connection"
SERVICE_NO_TLS = "the service did not complete a TLS handshake"


class DoorClient(EngineStreams):
    def __init__(self, host: str, port: int, key: str):
        super().__init__(f"tcp://{host}:{port}", timeout=TIMEOUT, headers={"Authorization": f"Bearer {key}"})

    async def connect_through(
        self, container_id: str, address: str, port: int, *, tls: bool = False
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to a container's port, made on its machine from inside
        its network namespace (with TLS, unverified, when asked), then relayed
        by the door."""
        query = urllib.parse.urlencode({"address": address, "port": port, **({"tls": 1} if tls else {})})
        return await self._upgrade(f"/gpuhost/containers/{checked_id(container_id)}/connect?{query}", b"{}", "connect")

    async def dial(
        self, info: dict, address: str, port: int, *, tls: ssl.SSLContext | None, timeout: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """As on one machine (streams/tunnel.py): refused, not TLS or unreachable."""
        try:
            return await asyncio.wait_for(
                self.connect_through(str(info.get("Id") or ""), address, port, tls=tls is not None), timeout
            )
        except EngineError as exc:
            text = str(exc).removeprefix("Docker Engine: ")
            if text.startswith(SERVICE_REFUSED):
                raise ConnectionRefusedError(text) from None
            if text.startswith(SERVICE_NO_TLS):
                raise ssl.SSLError(text) from None
            raise OSError(text) from None

    async def machine(self, live: bool) -> dict:
        """That machine's own report (inventory/machine_report.py); `live`: its
        GPUs' figures alone, which never make the agent there probe again."""
        reply = await self._call("GET", "/gpuhost/machine", params={"live": "1"} if live else None)
        if not isinstance(reply, dict):
            raise EngineError("the agent's machine report is not a JSON object")
        return reply

    async def disk(self) -> dict:
        """The rentals' use of that machine's disk (runtime/swarm_stacks.py's rental_disk_figures)."""
        reply = await self._call("GET", "/gpuhost/disk", timeout=DISK_SECONDS)
        if not isinstance(reply, dict):
            raise EngineError("the agent's disk figures are not a JSON object")
        return reply

    async def follow_events(self, on_event: Callable[[dict], None]) -> None:
        """That machine's engine's events for the agent's containers (the door
        cuts them so), each handed to `on_event`, until the stream ends. No
        overall timeout: a machine may be quiet for days."""
        try:
            async with self._session().get(
                "/events", timeout=aiohttp.ClientTimeout(total=None, sock_connect=TIMEOUT)
            ) as response:
                if response.status >= 400:
                    raise EngineError(f"the agent refused its events: HTTP {response.status}")
                while line := await response.content.readline():
                    if line.strip():
                        event = json.loads(line)
                        if isinstance(event, dict):
                            on_event(event)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as exc:
            raise EngineUnreachable(f"the events stream broke: {type(exc).__name__}: {exc}") from exc

    async def hang_up(self, exec_id: str, container_id: str) -> None:
        try:
            await self._call("POST", f"/gpuhost/exec/{checked_id(exec_id)}/hangup")
        except EngineError:
            pass  # the container, the exec or the machine is gone: nothing left to hang up

    async def signal(self, exec_id: str, container_id: str, signum: int) -> bool:
        try:
            reply = await self._call("POST", f"/gpuhost/exec/{checked_id(exec_id)}/signal", params={"number": signum})
        except EngineError:
            return False
        return bool(isinstance(reply, dict) and reply.get("sent"))

    async def open_files(self, info: dict) -> ContainerFiles:
        """The helper started on the container's machine; its calls relayed both ways."""
        path = f"/gpuhost/containers/{checked_id(str(info.get('Id') or ''))}/files"
        return await ContainerFiles.over(*await self._upgrade(path, b"{}", "file session"))

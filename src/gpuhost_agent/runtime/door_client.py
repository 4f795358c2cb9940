"""The engine of another machine of a Swarm environment, as its agent's door
serves it to the leader (streams/door.py, docs/swarm.md).

A container's inspect, log and execs go through the door as the engine's own
API, so this is an EngineStreams whose address is the door, over mutual TLS
(the leader's certificate, service/swarm_tls.py), and whose requests carry
the environment's key. What is not in the engine's API is
done by the agent on that machine, where the container's processes and
network are: a tunnel's last hop, SFTP's file helper, and the hang-up or
signal of an exec. These cannot be done from the leader: the pids an engine
reports are its own machine's, and a stack's overlay addresses are reachable
only from inside its containers' namespaces.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Iterable

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from gpuhost_agent.runtime.container_at import ContainerAt
from gpuhost_agent.runtime.container_files import ContainerFiles
from gpuhost_agent.runtime.engine.client import EngineError, read_events
from gpuhost_agent.runtime.engine.records import EngineEvent
from gpuhost_agent.runtime.engine.streams import EngineStreams, EngineUnreachable, checked_id
from gpuhost_agent.runtime.engine.upgrade import upgrade_request, upgraded

TIMEOUT = 10.0
DISK_SECONDS = 40.0  # `GET /system/df` there may take its engine's 35 s on a big host
# How the door says why a tunnel's last hop failed (its messages start so):
# the tunnel tells a service still starting from one that is not HTTPS.
SERVICE_REFUSED = "the service refused the connection"
SERVICE_NO_TLS = "the service did not complete a TLS handshake"


# After an upgrade, the leader's bytes go in frames: a 4-byte length, then
# that many bytes; a frame of length 0 ends the input (TLS has no half-close).
FRAME_HEADER = 4
FRAME_LIMIT = 64 * 1024
# The most of one answer read from a door: a machine report is tens of KiB, a
# machine's container list a few MiB at most. Another machine is untrusted (its
# agent may be compromised): a 64 MiB report took the leader from 47 to 300 MiB.
ANSWER_BYTES = 8 * 1024 * 1024


# The leader's revocation list (base64 of its DER), with each of its requests: a worker takes one newer
# than its own, so that a certificate the leader had before opens no door (service/swarm_tls.accept_crl).
CRL_HEADER = "X-Gpuhost-Crl"
NODE_DOMAIN = "node.gpuhost.invalid"


class _DoorAddress(AbstractResolver):
    """The door's address for its node's name, and no other lookup: the name is
    what TLS checks, never a name any resolver is asked for."""

    def __init__(self, address: str):
        self._address = address

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        try:
            addresses = [ipaddress.ip_address(self._address)]
        except ValueError:  # GPUHOST_SWARM_WORKERS may name the machine
            found = await asyncio.get_running_loop().getaddrinfo(self._address, port, type=socket.SOCK_STREAM)
            addresses = [ipaddress.ip_address(info[4][0]) for info in found]
        return [
            ResolveResult(
                hostname=host,
                host=str(address),
                port=port,
                family=socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        return None


def node_name(node: str) -> str:
    """The name a worker's certificate holds for its Swarm node (service/swarm_tls.py),
    which the leader asks of the door it dials for that node."""
    return f"{node.lower()}.{NODE_DOMAIN}"


class DoorClient(EngineStreams):
    """Over mutual TLS (`tls`: the leader's client context, service/swarm_tls.py),
    to the door of `node`: its certificate must name it (checked by OpenSSL when
    the context checks names; a door of another machine is refused)."""

    def __init__(
        self, host: str, port: int, key: str, tls: ssl.SSLContext, node: str | None = None, crl: str | None = None
    ):
        """`crl`: the leader's revocation list, as swarm_tls.crl_header gives it."""
        headers = {"Authorization": f"Bearer {key}", **({CRL_HEADER: crl} if crl else {})}
        super().__init__(f"tcp://{host}:{port}", timeout=TIMEOUT, headers=headers)
        self._host, self._port, self._tls = host, port, tls
        self._server_name = node_name(node) if node else None

    async def _call_raw(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        params: dict | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> tuple[bytes, str]:
        """Every answer read up to ANSWER_BYTES (or the call's own, smaller, cap)."""
        cap = min(max_bytes or ANSWER_BYTES, ANSWER_BYTES)
        return await super()._call_raw(method, path, body=body, params=params, timeout=timeout, max_bytes=cap)

    def _session(self) -> aiohttp.ClientSession:
        """Requests name the node (the name TLS checks), resolved to the door's address here alone."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http.closed or self._http_loop is not loop:
            netloc = f"[{self._host}]" if ":" in self._host else self._host
            resolver = None
            if self._server_name:
                netloc, resolver = self._server_name, _DoorAddress(self._host)
            self._http = aiohttp.ClientSession(
                base_url=f"https://{netloc}:{self._port}",
                connector=aiohttp.TCPConnector(limit=0, ssl=self._tls, resolver=resolver),
                auto_decompress=False,
                headers=self._headers,
            )
            self._http_loop = loop  # close() closes only a session of its own loop
        return self._http

    async def _upgrade(self, path: str, body: bytes, what: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """POST with `Upgrade: tcp` over TLS; on 101 or 200, the connection both
        ways, the leader's side framed (a writer whose write_eof is a frame)."""
        loop = asyncio.get_running_loop()
        head = upgrade_request(path, "gpuhost", self._headers, body)

        async def connect() -> tuple[asyncio.StreamReader, _FramedWriter]:
            reader = asyncio.StreamReader(limit=FRAME_LIMIT, loop=loop)
            transport, protocol = await loop.create_connection(
                lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                self._host,
                self._port,
                ssl=self._tls,
                server_hostname=self._server_name,
            )
            return reader, _FramedWriter(transport, protocol, reader, loop)

        return await upgraded(
            connect,
            lambda writer: writer.write_head(head),
            timeout=self._timeout,
            failed=f"the agent's door: {what} failed",
        )

    async def connect_through(
        self, container_id: str, address: str, port: int, *, tls: bool = False
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to a container's port, made on its machine from inside
        its network namespace (with TLS, unverified, when asked), then relayed
        by the door."""
        query = urllib.parse.urlencode({"address": address, "port": port, **({"tls": 1} if tls else {})})
        return await self._upgrade(f"/gpuhost/containers/{checked_id(container_id)}/connect?{query}", b"{}", "connect")

    async def dial(
        self, container: ContainerAt, address: str, port: int, *, tls: ssl.SSLContext | None, timeout: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """As on one machine (streams/tunnel.py): refused, not TLS or unreachable."""
        try:
            return await asyncio.wait_for(
                self.connect_through(container.id, address, port, tls=tls is not None), timeout
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

    async def follow_events(self, on_event: Callable[[EngineEvent], None]) -> None:
        """That machine's engine's events for the agent's containers (the door
        cuts them so), each handed to `on_event`, until the stream ends. No
        overall timeout: a machine may be quiet for days."""
        try:
            async with self._session().get(
                "/events", timeout=aiohttp.ClientTimeout(total=None, sock_connect=TIMEOUT)
            ) as response:
                if response.status >= 400:
                    raise EngineError(f"the agent refused its events: HTTP {response.status}")
                # Split as the engine's own stream is (runtime/engine/client.py): the lines
                # carry renters' labels, and a readline's cap would end the events
                # of every renter on that machine at one renter's long line.
                await read_events(response.content, on_event)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
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

    async def open_files(self, container: ContainerAt) -> ContainerFiles:
        """The helper started on the container's machine; its calls relayed both ways."""
        path = f"/gpuhost/containers/{checked_id(container.id)}/files"
        return await ContainerFiles.over(*await self._upgrade(path, b"{}", "file session"))


class _FramedWriter(asyncio.StreamWriter):
    """The leader's side of an upgraded connection to a door: every write a
    frame (or several), and write_eof a frame of length 0, which the door
    turns into a half-close on its side (streams/door.py)."""

    def write_head(self, data: bytes) -> None:
        super().write(data)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        for start in range(0, len(view), FRAME_LIMIT):
            part = bytes(view[start : start + FRAME_LIMIT])
            super().write(len(part).to_bytes(FRAME_HEADER, "big") + part)

    def writelines(self, data: Iterable[bytes | bytearray | memoryview]) -> None:
        for item in data:
            self.write(item)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if not self.is_closing():
            super().write(bytes(FRAME_HEADER))

"""Tunnels: a TCP connection to one port of a rental's container, relayed as a
byte stream over the stream's WebSocket (docs/streams.md, "tunnel").

The agent dials out to the marketplace, so a renter reaches a service on a host
behind NAT without a port opened on the host. What the agent connects to is
decided from the engine's own record of the container, read here, never from
the request (its refusals are streams/admission.py's, with every other
refusal of a stream): only a TCP port the container declares
(Config.ExposedPorts, which Compose fills from `ports:` and `expose:`; on a
Swarm the agent's label holds the `expose:` ones: runtime/declared_ports.py), only
on the container's own addresses on its networks. The host, 127.0.0.1 and other containers are out
of reach whatever the marketplace asks, and whatever address the engine
recorded: an address is dialled only inside the subnets of the networks the
agent created for the container's stack, and never when it is the host's own,
link-local or a gateway (streams/sandbox_addresses.py).

A stack whose template is `insecure` has services that speak HTTPS with a
certificate nobody can verify (self-signed, made at start). For such a stack
the marketplace asks with `tls`, and the agent speaks TLS to the service
without verifying it: the renter's side of the tunnel stays plain HTTP (on a
real marketplace, its own HTTPS front). Verification would buy nothing here:
the agent connects only to the container's own address on a port it
declares, which no one else can answer for.

Bytes are relayed as they come, both ways, with backpressure: the next read
from one side waits until the other side took the last chunk. A text message
`{"type": "eof"}` is a half-close in either direction (the client or the
service shut down its sending side); the WebSocket's close ends everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from gpuhost_agent.errors import Refusal
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.declared_ports import declared_ports as runtime_declared_ports
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.streams import ContainerAt
from gpuhost_agent.streams import sandbox_addresses
from gpuhost_agent.streams.sink import Sink, SinkClosed, finish

# Per read, and the service connection's buffer limit: at most about three
# times this is held per direction of a tunnel connection while bytes flow.
# 256 KiB (was 64): a 200 MiB download through a tunnel went from 567 to 666
# MB/s here, a quarter of the reads, frames and wakeups per MiB.
CHUNK = 256 * 1024
CONNECT_TIMEOUT = 5.0
QUICK_ACK = getattr(socket, "TCP_QUICKACK", None)  # Linux's
EOF_MESSAGE = {"type": "eof"}
NOT_LISTENING = wire.TUNNEL_NOT_LISTENING


def declared_ports(info: dict) -> set[int]:
    """The TCP ports the container declares (from `docker inspect`): its
    ExposedPorts, and on a Swarm its `expose:` ports in the agent's label
    (runtime/declared_ports.py)."""
    return runtime_declared_ports(info)


def container_addresses(info: dict) -> list[str]:
    """The container's own IP addresses, one per network it is on."""
    networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
    return [net["IPAddress"] for net in networks.values() if isinstance(net, dict) and net.get("IPAddress")]


def own_loopback(host: str) -> tuple[str, ...]:
    """The loopback addresses an SSH `-L`/`-D` destination names, dialled on
    the login's container's own loopback (streams/admission.py,
    connect_own_loopback); () when it names none. `localhost` is IPv4's
    then IPv6's, as a client would try them; 127.0.0.0/8 and ::1 as given."""
    name = host.strip().lower().removesuffix(".")
    if name == "localhost":
        return ("127.0.0.1", "::1")
    try:
        address = ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
    except ValueError:
        return ()
    return (str(address),) if address.is_loopback else ()


Dial = Callable[..., Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
NetworkInspect = Callable[[str], Awaitable[dict]]  # the engine's GET /networks/{id}
Judging = Callable[[dict, NetworkInspect], Awaitable[sandbox_addresses.Judge]]


async def address_judge(info: dict, network: NetworkInspect) -> sandbox_addresses.Judge:
    """Why a tunnel may not dial each address of the container `info`: its
    networks as the engine describes them (`network` inspects one by id; one
    the engine cannot describe counts as none of the stack's), and this
    machine's own addresses as its kernel lists them."""
    described = []
    for network_id in sandbox_addresses.network_ids(info):
        try:
            described.append(await network(network_id))
        except (EngineError, OSError, asyncio.TimeoutError):
            continue
    # Read for every connection, never kept: an address the host gained a
    # moment ago (an interface up, a network made) is the host's at once. A
    # read kept for a second let a tunnel dial the host's own server through
    # an address added within that second (test_tunnel_addresses_engine.py).
    return sandbox_addresses.judge(info, described, await asyncio.to_thread(read_host_networks))


async def no_network(network_id: str) -> dict:
    """For a caller without an engine: no network described, so no address is dialled."""
    raise EngineError(f"no engine to describe network {network_id[:12]}")


def read_host_networks() -> list[sandbox_addresses.IPNetwork]:
    """This network namespace's own addresses (the agent's: the host's)."""
    texts = []
    for path in ("/proc/net/fib_trie", "/proc/net/if_inet6"):
        try:
            with open(path, encoding="ascii", errors="replace") as file:
                texts.append(file.read())
        except OSError:
            texts.append("")
    return sandbox_addresses.host_networks(*texts)


class NoService(Refusal):
    """No address of the container took the connection; the message says why, as the refusal does."""


async def dial_service(
    container: ContainerAt,
    addresses: list[str],
    port: int,
    *,
    dial: Dial,
    tls: ssl.SSLContext | None,
    timeout: float,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The first of `addresses` (the container's own, already judged:
    streams/admission.py) whose service takes the connection, or NoService
    with the last reason it did not."""
    problem = NOT_LISTENING
    for address in addresses:
        try:
            return await dial(container, address, port, tls=tls, timeout=timeout)
        except ConnectionRefusedError:
            continue
        except ssl.SSLError as exc:
            problem = f"the service did not complete a TLS handshake (the stack is insecure: HTTPS expected): {exc}"
        except (OSError, asyncio.TimeoutError) as exc:
            problem = f"cannot reach the service: {type(exc).__name__}"
    raise NoService(problem)


def unverified_tls() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class TunnelRelay:
    """One open tunnel: the service's connection and the stream's sink."""

    def __init__(self, sink: Sink, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._sink, self._reader, self._writer = sink, reader, writer
        self._ended: str | None = None
        self._stop = asyncio.Event()
        self.bytes_up = self.bytes_down = 0  # marketplace -> service, service -> marketplace

    def stop(self, reason: str) -> None:
        self._ended = self._ended or reason
        self._stop.set()

    async def run(self) -> str:
        up = asyncio.create_task(self._up())
        down = asyncio.create_task(self._down())
        stop = asyncio.create_task(self._stop.wait())
        try:
            # Over when the marketplace closes, or when both sides have shut down
            # sending (each direction saw its EOF), or when stopped from outside.
            pending: set[asyncio.Task[Any]] = {up, down, stop}
            while pending:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if stop.done() or (up.done() and up.result() == "closed"):
                    break
                if (down.done() and down.result() == "failed") or (up.done() and down.done()):
                    break
        finally:
            for task in (up, down, stop):
                task.cancel()
            await asyncio.gather(up, down, stop, return_exceptions=True)
            self._writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await asyncio.wait_for(self._writer.wait_closed(), 2)
        end = {"type": "end", "reason": self._ended} if self._ended else None
        return await finish(self._sink, end)

    async def _up(self) -> str:
        """Marketplace -> service. "closed" when the marketplace closed the
        stream, "eof" when it half-closed (the service is told the same)."""
        try:
            while True:
                data = await self._sink.receive()
                if data is None:
                    return "closed"
                if isinstance(data, bytes):
                    self.bytes_up += len(data)
                    self._writer.write(data)
                    await self._writer.drain()
                elif _is_eof(data):
                    if self._writer.can_write_eof():
                        self._writer.write_eof()
                    return "eof"
        except (ConnectionError, OSError):  # the service went away: the stream ends
            return "closed"

    async def _down(self) -> str:
        """Service -> marketplace, until the service shuts down sending ("eof").
        "failed" when either side broke: the stream is closed without an end
        message, which the marketplace passes on as a closed connection."""
        service = self._writer.get_extra_info("socket") if QUICK_ACK is not None else None
        try:
            while chunk := await self._reader.read(CHUNK):
                self.bytes_down += len(chunk)
                if service is not None:
                    service = _acknowledge_at_once(service)
                await self._sink.send_bytes(chunk)
            await self._sink.send_json(EOF_MESSAGE)
        except (SinkClosed, ConnectionError, OSError):
            return "failed"
        return "eof"


def _acknowledge_at_once(service: Any) -> Any:
    """TCP_QUICKACK on the service's socket, renewed after each read; the
    socket, or None once it cannot take it. A service that writes an answer
    in two pieces with Nagle on (Python's http.server: the head, then the
    body) holds the second until the first is acknowledged, which Linux's
    delayed ACK puts off by up to 40 ms: 44 ms an answer against 0.2 ms with
    it, on loopback here."""
    try:
        service.setsockopt(socket.IPPROTO_TCP, QUICK_ACK, 1)
    except (OSError, AttributeError):  # closed, not TCP (TLS wraps the same socket): nothing to hurry
        return None
    return service


def _is_eof(text: str) -> bool:
    try:
        return json.loads(text) == EOF_MESSAGE
    except ValueError:
        return False

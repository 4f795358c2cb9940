"""The pull guard: the HTTP proxy dockerd's pulls go through.

dockerd, a root process on the host's network, fetches a renter's image. It
resolves the registry's name itself, after the agent judged it, and follows
the redirects and token realms a registry names. So a name that answered a
public address to the agent and the host (or 169.254.169.254) to dockerd a
moment later (DNS rebinding), or a redirect to the host, made the host's
engine ask the host. With dockerd's HTTPS_PROXY and HTTP_PROXY at this guard,
every connection dockerd opens for a pull is resolved here once, judged as
the sandbox judges a registry (none of the host's own addresses, loopback,
link-local, unspecified, multicast or reserved), and dialled at the very
address judged. A registry the host allowed (GPUHOST_ALLOWED_REGISTRIES)
passes. A refusal is a 403 whose reason names the address, which dockerd
shows in its error.

An operator's own proxy stays in force as the guard's upstream: the guard asks
it (CONNECT) for the judged address, never for the name. Only root's processes
may connect (dockerd and the agent): the kernel refuses another user of the
host before the guard sees it (runtime/egress_rules.guard_rules). Reads are
bounded (a request head of HEAD_LIMIT bytes), at most MAX_CONNECTIONS are open
at once (counted at the accept), PER_TARGET to one registry host, and a
connection idle in both directions for IDLE_SECONDS is closed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.errors import Refusal
from gpuhost_agent.streams.sandbox_addresses import IPNetwork, registry_address_problem

log = get_logger(__name__)

HEAD_LIMIT = 8192
HEAD_SECONDS = 5.0
LOOKUP_SECONDS = 3.0
DIAL_SECONDS = 10.0
IDLE_SECONDS = 300.0
MAX_CONNECTIONS = 256
PER_TARGET = 32  # open at once to one registry host: a slow one cannot hold every slot
CHUNK = 256 * 1024
# A plain GET of PROBE_PATH?<challenge> answers PROBE_ANSWER and the challenge's HMAC with the guard's key
# (root's file): how doctor knows the guard listens there, and not a program that took its port.
PROBE_PATH = "/gpuhost-pull-guard"
PROBE_ANSWER = b"gpuhost-agent pull guard "
# A host name's labels, or an IPv4 literal; IPv6 comes in brackets.
_NAME = re.compile(r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})\.)*[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})\.?")
_HOP_HEADERS = {b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive"}

Lookup = Callable[[str, int], Awaitable[list[str]]]  # name, port -> its addresses
Allowed = Callable[[str, int], bool]  # host, port -> whether the host allowed this registry
HostNetworks = Callable[[], Awaitable[list[IPNetwork]]]


class GuardRefused(Refusal):
    """A request the guard does not carry: the status and the reason it answers."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass(frozen=True)
class Target:
    host: str  # a name, an IPv4 literal, or an IPv6 literal without brackets
    port: int

    def authority(self, host: str | None = None) -> str:
        shown = host if host is not None else self.host
        return f"[{shown}]:{self.port}" if ":" in shown else f"{shown}:{self.port}"


@dataclass(frozen=True)
class Request:
    target: Target
    tunnel: bool  # CONNECT: bytes both ways after the answer; else one plain HTTP request to forward
    head: bytes  # for a plain request: the head to send on, in origin form, `Connection: close`


def parse_authority(text: str, default_port: int | None = None) -> Target:
    """`host:port` or `[v6]:port` (the port may be left out where a default
    exists); a host outside names' and literals' characters is refused."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        try:
            ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            raise GuardRefused(400, "the target's IPv6 address cannot be read") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
        if not _NAME.fullmatch(host):
            raise GuardRefused(400, "the target is not a host name or address")
    if not port_text and default_port is not None:
        return Target(host.lower().rstrip("."), default_port)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise GuardRefused(400, "the target's port is missing or out of range")
    return Target(host.lower().rstrip("."), int(port_text))


def parse_head(head: bytes) -> Request:
    """A proxy request's head: `CONNECT host:port`, or an absolute `http://` URL."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise GuardRefused(400, "not an HTTP/1 request")
    method, target, version = (part.decode("ascii", "replace") for part in parts)
    if method == "CONNECT":
        return Request(parse_authority(target), True, b"")
    if not target.startswith("http://"):
        raise GuardRefused(400, "a proxy request names an absolute http:// URL, or is a CONNECT")
    authority, slash, path = target[len("http://") :].partition("/")
    kept = [line for line in lines[1:] if line and line.split(b":", 1)[0].strip().lower() not in _HOP_HEADERS]
    forwarded = b"\r\n".join([f"{method} /{path if slash else ''} {version}".encode(), *kept, b"Connection: close"])
    return Request(parse_authority(authority, 80), False, forwarded + b"\r\n\r\n")


# Lookups of the guard's own: a resolver that hangs holds one of these threads, never one of the
# event loop's shared pool (slow lookups there would delay every to_thread of the agent).
LOOKUP_THREADS = 8
LOOKUPS = ThreadPoolExecutor(max_workers=LOOKUP_THREADS, thread_name_prefix="pull-guard-lookup")
_lookups_pending = [0]


async def system_lookup(host: str, port: int) -> list[str]:
    """The system resolver's answer, in the guard's own threads; refused at once when they are all busy."""
    if _lookups_pending[0] >= 2 * LOOKUP_THREADS:
        raise OSError("every lookup thread of the pull guard is busy")
    _lookups_pending[0] += 1
    try:
        infos = await asyncio.get_running_loop().run_in_executor(
            LOOKUPS, partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        )
    finally:
        _lookups_pending[0] -= 1
    return [str(info[4][0]) for info in infos]


@dataclass
class PullGuard:
    """The proxy; `allowed` says which registries the host allowed,
    `host_networks` reads the host's own addresses (for every connection:
    one added a moment ago is the host's at once), `upstream` is an
    operator's proxy (host, port) the guard goes through."""

    allowed: Allowed
    host_networks: HostNetworks
    upstream: tuple[str, int] | None = None
    lookup: Lookup = system_lookup
    opened: tuple[IPNetwork, ...] = ()  # private networks the operator opened (GPUHOST_EGRESS_ALLOW)

    key: bytes = b""  # answers the probe's challenge (the agent's root-only file)

    def __post_init__(self) -> None:
        self.open = 0
        self.refused = 0
        self._by_target: dict[str, int] = {}

    async def serve(self, host: str, port: int) -> asyncio.Server:
        return await asyncio.start_server(self._connection, host, port, limit=HEAD_LIMIT)

    async def address_for(self, target: Target) -> str:
        """The one address the guard dials for `target`, judged; GuardRefused says why not."""
        if self.allowed(target.host, target.port):
            return target.host  # the host's own choice of registry: dialled by its name
        try:
            addresses = [str(ipaddress.ip_address(target.host.split("%")[0]))]
        except ValueError:
            try:
                addresses = await asyncio.wait_for(self.lookup(target.host, target.port), LOOKUP_SECONDS)
            except (OSError, asyncio.TimeoutError) as exc:
                raise GuardRefused(502, f"{target.host} does not resolve ({type(exc).__name__})") from None
        if not addresses:
            raise GuardRefused(502, f"{target.host} does not resolve")
        networks = await self.host_networks()
        for address in addresses:
            why = registry_address_problem(ipaddress.ip_address(address.split("%")[0]), networks, self.opened)
            if why:
                raise GuardRefused(
                    403, f"{target.host} resolves to {address}, {why}: the host's engine does not go there"
                )
        return addresses[0]

    async def _dial(self, target: Target, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.upstream is None:
            return await asyncio.wait_for(asyncio.open_connection(address, target.port, limit=CHUNK), DIAL_SECONDS)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream, limit=CHUNK), DIAL_SECONDS)
        except (OSError, asyncio.TimeoutError) as exc:
            host, port = self.upstream
            raise GuardRefused(502, f"the upstream proxy {host}:{port} did not answer ({type(exc).__name__})") from None
        authority = target.authority(address)
        writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DIAL_SECONDS)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError) as exc:
            writer.close()
            raise GuardRefused(502, f"the upstream proxy did not answer ({type(exc).__name__})") from None
        status = head.split(b"\r\n", 1)[0].decode("ascii", "replace")
        if status.split(" ")[1:2] != ["200"]:
            writer.close()
            raise GuardRefused(502, f"the upstream proxy answered {status[:80]!r}")
        return reader, writer

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            if self.open > MAX_CONNECTIONS:  # at the accept: a flood holds no descriptor past it
                return
            await self._carry(reader, writer)
        except (ConnectionError, OSError):
            pass
        finally:
            self.open -= 1
            writer.close()

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_SECONDS)
        except asyncio.LimitOverrunError:
            await _answer(writer, 431, f"a request head is at most {HEAD_LIMIT} bytes")
            return
        except (asyncio.IncompleteReadError, asyncio.TimeoutError):
            return
        if head.startswith(f"GET {PROBE_PATH}?".encode()):
            challenge = head.split(b" ", 2)[1].partition(b"?")[2][:64]
            await _answer(writer, 200, "", PROBE_ANSWER + _proof(self.key, challenge))
            return
        try:
            request = parse_head(head[:-4])
            address = await self.address_for(request.target)
            try:
                far_reader, far_writer = await self._dial(request.target, address)
            except (OSError, asyncio.TimeoutError) as exc:
                raise GuardRefused(502, f"{request.target.authority()} did not answer ({type(exc).__name__})") from None
        except GuardRefused as refused:
            self.refused += refused.status == 403
            log.warning("pull_refused", target=_shown(head), status=refused.status, reason=refused.reason)
            await _answer(writer, refused.status, refused.reason)
            return
        host = request.target.host
        self._by_target[host] = self._by_target.get(host, 0) + 1
        try:
            if self._by_target[host] > PER_TARGET:
                await _answer(writer, 503, f"more than {PER_TARGET} connections at once to {host}")
                return
            if request.tunnel:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                far_writer.write(request.head)
            await _splice(reader, writer, far_reader, far_writer)
        finally:
            far_writer.close()
            self._by_target[host] -= 1
            if not self._by_target[host]:
                del self._by_target[host]


def _proof(key: bytes, challenge: bytes) -> bytes:
    return hmac.new(key, challenge, hashlib.sha256).hexdigest().encode()


def new_key(path: Path) -> bytes:
    """A new key for this start, written where root alone reads it (the state directory). Blocking."""
    key = secrets.token_bytes(32)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as out:
        out.write(key)
    os.replace(temporary, path)
    return key


async def answers(host: str, port: int, key_file: Path) -> str | None:
    """Whether the agent's guard answers on host:port (None), else why not: the
    probe, in the agent or in doctor, sends a new challenge, which only a guard
    holding the key in `key_file` answers (a program that took the port cannot)."""
    try:
        key = await asyncio.to_thread(key_file.read_bytes)
    except OSError as exc:
        return f"cannot read the pull guard's key {key_file}: {exc.strerror or exc} (run doctor as root)"
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
    except (OSError, asyncio.TimeoutError) as exc:
        return f"nothing answers on {host}:{port} ({type(exc).__name__}: {exc})"
    challenge = secrets.token_hex(16).encode()
    try:
        writer.write(f"GET {PROBE_PATH}?{challenge.decode()} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        said = await asyncio.wait_for(reader.read(1024), 2)
    except (OSError, asyncio.TimeoutError) as exc:
        said = f"{type(exc).__name__}".encode()
    finally:
        writer.close()
    if said.endswith(PROBE_ANSWER + _proof(key, challenge)):
        return None
    return f"{host}:{port} is another program's, not the agent's pull guard (it cannot answer the agent's key)"


def _shown(head: bytes) -> str:
    return head.split(b"\r\n", 1)[0][:200].decode("ascii", "replace")


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str, body: bytes | None = None) -> None:
    """An answer whose reason phrase says why (dockerd prints the status line), then the connection ends."""
    phrase = re.sub(r"[^\x20-\x7e]", "?", reason)[:300] or "OK"
    payload = body if body is not None else (phrase + "\n").encode()
    writer.write(
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + payload
    )
    try:
        await writer.drain()
    except (ConnectionError, OSError):
        pass


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    far_reader: asyncio.StreamReader,
    far_writer: asyncio.StreamWriter,
) -> None:
    """Bytes both ways, a chunk at a time with back-pressure, until both ends
    are done or neither moved a byte for IDLE_SECONDS."""
    last = [time.monotonic()]

    async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while chunk := await source.read(CHUNK):
                last[0] = time.monotonic()
                sink.write(chunk)
                await sink.drain()
            if sink.can_write_eof():
                sink.write_eof()
        except (ConnectionError, OSError):
            pass

    async def idle() -> None:
        # A deadline each byte moves on: sleeping until it is the whole watch.
        while (wait := last[0] + IDLE_SECONDS - time.monotonic()) > 0:  # noqa: ASYNC110
            await asyncio.sleep(wait)

    async def both() -> None:
        await asyncio.gather(pump(reader, far_writer), pump(far_reader, writer))

    tasks = {asyncio.ensure_future(both()), asyncio.ensure_future(idle())}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

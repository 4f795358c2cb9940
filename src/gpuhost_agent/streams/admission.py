"""Whether a request read on the channel becomes a stream, and the refusal it
gets when not (docs/streams.md, 2).

Once requests.py has parsed a request (one it cannot parse is refused there,
with 400), every reason to refuse it is decided here, in the order the
channel asks: on arrival (its streamId already open, a cap of limits.py, an
agent that is stopping), then before the stream's WebSocket is opened (the
container must be this rental's and on a machine the agent reaches, an SSH
login needs a running container open to it, a tunnel's service must accept
a connection), and last for a stream still being opened when its rental or
the agent ends. The refusal is sent from here too, quietly when the channel
closed meanwhile. Inside an SSH connection, a `-L` to another container
keeps the same access and tunnel rules (streams/ssh/server.py asks them
here), a `-L localhost:PORT` reaches the login's container's own loopback
(connect_own_loopback), and each session reads the same answer of where its
container runs (streams/ssh/connection.py).

Kept apart from channel.py, which keeps the WebSocket open and runs the
streams, so that what a renter can reach reads in one place, not between the
channel's reconnects and tasks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import aiohttp

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.records import ContainerSummary
from gpuhost_agent.runtime.engine.streams import ContainerAt, ContainerGone, EngineStreams
from gpuhost_agent.runtime.netns_dial import dial_in_namespace
from gpuhost_agent.streams import tunnel
from gpuhost_agent.streams.exec_rate import ExecRate
from gpuhost_agent.streams.limits import StreamLimits, is_connection, is_logging_in
from gpuhost_agent.streams.requests import (
    ContainerRequest,
    LogsRequest,
    Refusal,
    SshRequest,
    StreamRequest,
    TerminalRequest,
    TunnelRequest,
)
from gpuhost_agent.streams.ssh.access import pick_any
from gpuhost_agent.uplink.session import SessionState

log = get_logger(__name__)

Service = tuple[asyncio.StreamReader, asyncio.StreamWriter]  # a tunnel's open connection to its service
ListStack = Callable[[str], Awaitable[list[ContainerSummary]]]  # a stack's containers, on every machine
NOT_IN_STACK = "no such container in this stack"


def refusal_on_arrival(
    request: StreamRequest,
    already_open: bool,
    open_requests: Iterable[StreamRequest],
    caps: StreamLimits,
    stopping: bool,
) -> Refusal | None:
    """Why the channel refuses `request` as soon as it reads it, or None."""
    if already_open:
        return Refusal(request.stream_id, 409, "a stream with this streamId is open")
    over = over_caps(request, open_requests, caps)
    if over is not None:
        return over
    if stopping:
        return Refusal(request.stream_id, 503, "the agent is stopping")
    return None


def over_caps(request: StreamRequest, open_requests: Iterable[StreamRequest], caps: StreamLimits) -> Refusal | None:
    """Why `request` may not open now, past a cap of limits.py, or None:
    past the host's 503 (the host is busy); past the rental's, or past half
    of what the other rentals leave free, 429 (the renter's own doing: close
    one); each names the cap, and nothing already open is touched. The half
    means a rental that holds none always finds room while the host has any,
    however many rentals (one renter's or several) came first. SSH
    connections not logged in yet count on the host's cap only (their own
    per-rental cap is pre_login_to_drop's), so strangers holding them
    refuse the renter nothing."""
    connection = is_connection(request)
    same_kind = [r for r in open_requests if is_connection(r) == connection]
    theirs = sum(1 for r in same_kind if r.rental_id != request.rental_id)
    mine = sum(1 for r in same_kind if r.rental_id == request.rental_id and not is_logging_in(r))
    if connection:
        total, per_rental, what = caps.connections, caps.connections_per_rental, "tunnel and SSH connections"
    else:
        total, per_rental, what = caps.streams, caps.streams_per_rental, "log streams and terminals"
    if len(same_kind) >= total:
        return Refusal(request.stream_id, 503, f"too many open {what} on this host ({total})")
    if mine >= per_rental:
        return Refusal(
            request.stream_id,
            429,
            f"this rental has {per_rental} open {what}, the most one rental may hold; close one and try again",
        )
    share = (total - theirs + 1) // 2
    if mine >= share:
        return Refusal(
            request.stream_id,
            429,
            f"this rental has {mine} open {what}, half of what other rentals leave free on this host"
            f" ({total} in all, {theirs} theirs); close one and try again",
        )
    return None


def pre_login_to_drop(
    request: StreamRequest, open_requests: Iterable[StreamRequest], caps: StreamLimits
) -> SshRequest | None:
    """The rental's oldest SSH connection not logged in yet, to close so that
    `request` (a new one) fits in the rental's pre-login places, or None.
    Oldest first, like OpenSSH's MaxStartups drop: strangers who keep
    connections open without logging in only close each other's, and a
    renter's login is lost only when more than `ssh_logins_per_rental` new
    connections arrive during its handshake (then it retries). A logged-in
    connection is never closed here."""
    if not isinstance(request, SshRequest):
        return None
    waiting = [
        r for r in open_requests if isinstance(r, SshRequest) and r.rental_id == request.rental_id and is_logging_in(r)
    ]
    return waiting[0] if len(waiting) >= caps.ssh_logins_per_rental else None


async def admit(
    engine: EngineStreams, session: SessionState, request: StreamRequest, list_stack: ListStack
) -> tuple[Refusal | None, dict, Service | None]:
    """(refusal, the container's inspect ({} for SSH), the tunnel's connection):
    what the stream needs once its WebSocket is open, or why it is refused.
    `list_stack` lists a stack's containers (SshServices.stack_containers)."""
    if isinstance(request, SshRequest):
        return await check_ssh(list_stack, session, request), {}, None
    refusal, container = await check_container(engine, session, request)
    if container is None or refusal is not None:
        return refusal, {}, None
    if not isinstance(request, TunnelRequest):
        return None, container.info, None
    service = await connect_tunnel(container, request, dial=engine.dial, network=engine.network)
    if isinstance(service, Refusal):
        return service, container.info, None
    return None, container.info, service


async def check_container(
    engine: EngineStreams, session: SessionState, request: ContainerRequest
) -> tuple[Refusal | None, ContainerAt | None]:
    """The container and where it runs, or why the request is refused. A
    container whose machine cannot be reached serves its log alone."""
    try:
        container = await engine.locate(request.container_id)
    except ContainerGone:
        return Refusal(request.stream_id, 404, NOT_IN_STACK), None
    except EngineError as exc:
        return Refusal(request.stream_id, 503, f"Docker Engine: {exc}"[:500]), None
    refusal = check_access((container.info.get("Config") or {}).get("Labels"), session.env_id, request)
    if refusal is None and container.unreachable and not isinstance(request, LogsRequest):
        refusal = Refusal(request.stream_id, 409, f"{container.unreachable} (node {container.machine[:12]})")
    return refusal, container


def check_access(labels: Any, env_id: str | None, request: ContainerRequest) -> Refusal | None:
    """Only the agent's own containers, of this environment, of the request's
    rental and stack: Docker's labels alone say so. Every mismatch reads the
    same: what exists elsewhere is none of the asker's business."""
    labels = labels if isinstance(labels, dict) else {}
    if (
        env_id  # before a session names the environment, no container is this agent's
        and labels.get(wire.LABEL_MANAGED) == "true"
        and labels.get(wire.LABEL_ENV) == env_id
        and labels.get(wire.LABEL_RENTAL) == request.rental_id
        and labels.get(wire.LABEL_STACK) == request.stack_id
    ):
        return None
    return Refusal(request.stream_id, 404, NOT_IN_STACK)


async def check_ssh(list_stack: ListStack, session: SessionState, request: SshRequest) -> Refusal | None:
    """One of the request's stacks, of this rental, with a running container
    open to SSH; which stack and container is the login's choice."""
    for stack_id in request.stack_ids:
        try:
            containers = await list_stack(stack_id)
        except EngineError as exc:
            return Refusal(request.stream_id, 503, f"Docker Engine: {exc}"[:500])
        if pick_any(containers, session.env_id, request.rental_id, stack_id) is not None:
            return None
    return Refusal(request.stream_id, 404, "no running container of these stacks is open to SSH")


async def connect_tunnel(
    container: ContainerAt,
    request: TunnelRequest,
    *,
    dial: tunnel.Dial,
    network: tunnel.NetworkInspect = tunnel.no_network,
    judging: tunnel.Judging = tunnel.address_judge,
    timeout: float = tunnel.CONNECT_TIMEOUT,
) -> Service | Refusal:
    """Open the service's connection, or say why not (before any stream opens):
    only a TCP port the container declares, only on its own addresses that
    the stack's networks hold (streams/tunnel.py says why). `dial` and
    `network` are the engine's (runtime/engine/streams.py): on one machine a
    plain connection, in an environment of several one made where the
    container's networks are reachable; without `network` nothing is dialled."""
    info = container.info
    if request.port not in tunnel.declared_ports(info):
        return Refusal(request.stream_id, 403, f"port {request.port} is not a TCP port this container declares")
    addresses = tunnel.container_addresses(info)
    if not addresses or not (info.get("State") or {}).get("Running"):
        return Refusal(request.stream_id, 503, "the container is not running")
    judge = await judging(info, network)
    refused = [why for why in map(judge, addresses) if why]
    if len(refused) == len(addresses):
        log.warning("tunnel_address_refused", container=container.id[:12], why=refused[0])
        return Refusal(request.stream_id, 403, refused[0])
    allowed = [address for address in addresses if not judge(address)]
    tls = tunnel.unverified_tls() if request.tls else None
    try:
        return await tunnel.dial_service(container, allowed, request.port, dial=dial, tls=tls, timeout=timeout)
    except tunnel.NoService as exc:
        return Refusal(request.stream_id, 503, str(exc))


LoopbackDial = Callable[..., Awaitable[Service]]  # runtime/netns_dial.py's dial_in_namespace
ELSEWHERE = (
    "the container runs on another machine of this environment: its own loopback is reached only from there;"
    " forward to <service>:<declared port> instead"
)


async def connect_own_loopback(
    container: ContainerAt,
    request: TunnelRequest,
    env_id: str | None,
    addresses: Sequence[str],
    *,
    dial: LoopbackDial = dial_in_namespace,
    timeout: float = tunnel.CONNECT_TIMEOUT,
) -> Service | Refusal:
    """An SSH login's `-L localhost:PORT` or `-D` to it: a connection to the
    login's own container's loopback, on any port (Jupyter, TensorBoard and
    VS Code's server listen there), or why not. It is made inside the
    container's network namespace (runtime/netns_dial.py: its process pinned,
    never the host's namespace), so it reaches what a shell in that container
    reaches with `nc 127.0.0.1 PORT`, which the login may run anyway, and
    never the host's loopback. `addresses` are tunnel.own_loopback's."""
    info = container.info
    refused = check_access((info.get("Config") or {}).get("Labels"), env_id, request)
    if refused is not None:
        return refused
    if container.unreachable:
        return Refusal(request.stream_id, 409, container.unreachable)
    if container.machine:
        return Refusal(request.stream_id, 501, ELSEWHERE)
    state = info.get("State") or {}
    pid = state.get("Pid")
    if not state.get("Running") or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return Refusal(request.stream_id, 503, "the container is not running")
    problems = []
    for address in addresses:
        try:
            return await dial(pid, address, request.port, timeout, container_id=container.id)
        except ConnectionRefusedError:
            problems.append(f"{address}: nothing listens there")
        except asyncio.TimeoutError:
            problems.append(f"{address}: no answer within {timeout:g} s")
        except OSError as exc:  # NetnsError included: its reason, as runtime/netns_dial.py says it
            problems.append(f"{address}: {exc.strerror or type(exc).__name__}")
    where = f"port {request.port} on the container's own loopback"
    return Refusal(request.stream_id, 503, f"cannot connect to {where}: {'; '.join(problems)}"[:300])


def over_exec_rate(request: StreamRequest, execs: ExecRate) -> Refusal | None:
    """A terminal is a Docker exec, started within its rental's rate
    (exec_rate.py), as its SSH sessions are; the refusal says why (429)."""
    if not isinstance(request, TerminalRequest):
        return None
    said = execs.take(request.rental_id)
    return Refusal(request.stream_id, 429, said) if said else None


def refusal_when_ended(stream_id: str, reason: str) -> Refusal:
    """The answer to a stream still being opened when its rental ended or the agent stops."""
    if reason == "rental-ended":
        return Refusal(stream_id, 404, "the rental ended")
    if reason == "ssh-login-crowded":
        return Refusal(stream_id, 503, "too many SSH connections to this rental are logging in; try again")
    return Refusal(stream_id, 503, "the agent is stopping")


async def send_refusal(ws: aiohttp.ClientWebSocketResponse[bool], refusal: Refusal) -> None:
    """Tell the marketplace on the channel. A channel that closed meanwhile is
    no error: the marketplace times the request out."""
    try:
        await ws.send_str(json.dumps(refusal.message()))
    except (ConnectionError, aiohttp.ClientError, RuntimeError):
        pass

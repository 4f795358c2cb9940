"""Whether a request read on the channel becomes a stream, and the refusal it
gets when not (docs/streams.md, 2).

Once requests.py has parsed a request, every reason to refuse it is decided
here, in the order the channel asks: on arrival (its streamId already open, a
cap of limits.py, an agent that is stopping), then before the stream's
WebSocket is opened (the container must be this rental's, an SSH login needs a
running container open to it, a tunnel's service must accept a connection),
and last for a stream still being opened when its rental or the agent ends.
The refusal is sent from here too, quietly when the channel closed meanwhile.
Kept apart from channel.py, which keeps the WebSocket open and runs the
streams, so that what a renter can reach reads in one place, not between the
channel's reconnects and tasks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable

import aiohttp

from gpuhost_agent.runtime.engine import EngineError
from gpuhost_agent.runtime.engine_streams import ContainerAt, ContainerGone, EngineStreams
from gpuhost_agent.streams import limits
from gpuhost_agent.streams.limits import StreamLimits
from gpuhost_agent.streams.requests import (
    NOT_IN_STACK,
    ContainerRequest,
    LogsRequest,
    Refusal,
    SshRequest,
    StreamRequest,
    TunnelRequest,
    check_access,
)
from gpuhost_agent.streams.ssh_access import pick_any
from gpuhost_agent.streams.tunnel import connect
from gpuhost_agent.uplink.session import SessionState

Service = tuple[asyncio.StreamReader, asyncio.StreamWriter]  # a tunnel's open connection to its service
ListStack = Callable[[str], Awaitable[list[dict]]]  # a stack's containers, on every machine


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
    over = limits.refusal(request, open_requests, caps)
    if over is not None:
        return over
    if stopping:
        return Refusal(request.stream_id, 503, "the agent is stopping")
    return None


async def admit(
    engine: EngineStreams, session: SessionState, request: StreamRequest, list_stack: ListStack
) -> tuple[Refusal | None, dict, Service | None]:
    """(refusal, the container's inspect ({} for SSH), the tunnel's connection):
    what the stream needs once its WebSocket is open, or why it is refused.
    `list_stack` lists a stack's containers (SshServices.stack_containers)."""
    container = None
    if isinstance(request, SshRequest):
        refusal = await check_ssh(list_stack, session, request)
    else:
        refusal, container = await check_container(engine, session, request)
    service = (
        await connect(container, request, dial=engine.dial, network=engine.network)
        if refusal is None and container is not None and isinstance(request, TunnelRequest)
        else None
    )
    if isinstance(service, Refusal):
        refusal, service = service, None
    return refusal, container.info if container is not None else {}, service


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


async def check_ssh(list_stack: ListStack, session: SessionState, request: SshRequest) -> Refusal | None:
    """A stack of this rental with a running container open to SSH; which
    one is the login's choice."""
    try:
        containers = await list_stack(request.stack_id)
    except EngineError as exc:
        return Refusal(request.stream_id, 503, f"Docker Engine: {exc}"[:500])
    if pick_any(containers, session.env_id, request.rental_id, request.stack_id) is None:
        return Refusal(request.stream_id, 404, "no running container of this stack is open to SSH")
    return None


def refusal_when_ended(stream_id: str, reason: str) -> Refusal:
    """The answer to a stream still being opened when its rental ended or the agent stops."""
    if reason == "rental-ended":
        return Refusal(stream_id, 404, "the rental ended")
    return Refusal(stream_id, 503, "the agent is stopping")


async def send_refusal(ws: aiohttp.ClientWebSocketResponse[bool], refusal: Refusal) -> None:
    """Tell the marketplace on the channel. A channel that closed meanwhile is
    no error: the marketplace times the request out."""
    try:
        await ws.send_str(json.dumps(refusal.message()))
    except (ConnectionError, aiohttp.ClientError, RuntimeError):
        pass

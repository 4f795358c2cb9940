"""Renter terminals (docs/streams.md, sections 3 and 4).

`POST .../containers/{containerId}/terminal` checks the container and issues a
ticket (terminal_tickets.py); `GET /v1/terminals/{terminalId}?token=...` is
the renter's WebSocket. It is a public path (browsers cannot send the API key
on a WebSocket), so this handler checks the token itself, before the upgrade.
Only then is the agent asked for the terminal, and the two sockets are
relayed: renter binary (keystrokes) and `resize` to the agent, agent binary
(the TTY's output) and its `end` to the renter. Each direction waits for its
send before reading on, so neither side can fill the marketplace's memory.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import WSCloseCode, WSMsgType, web

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.local_marketplace.channel_hub import CLOSE_TIMEOUT, Stream, StreamRefused, close_quietly
from gpuhost_agent.local_marketplace.http_errors import json_body, json_error
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Conflict
from gpuhost_agent.local_marketplace.stream_targets import container_state, find_container, first_done, rental_active
from gpuhost_agent.local_marketplace.terminal_tickets import TicketRejected, dimension, terminal_options

log = get_logger(__name__)

TERMINAL_ROUTE = "/v1/terminals/{terminalId}"
RENTER_HEARTBEAT = 30.0
RENTER_MAX_MESSAGE = 1024 * 1024


def routes(state: MarketplaceState) -> list[web.RouteDef]:
    store, hub, tickets = state.store, state.streams, state.terminals

    async def create_terminal(request: web.Request) -> web.Response:
        rental_id, stack_id = request.match_info["rentalId"], request.match_info["stackId"]
        container = find_container(store, rental_id, stack_id, request.match_info["containerId"])
        state_now = container_state(store, stack_id, container)
        if not state_now.startswith("running"):
            return json_error(
                409,
                f"container {request.match_info['containerId'][:128]} is {state_now or 'not running'}: "
                "a terminal needs a running container (deploy the stack again to start it)",
            )
        options = terminal_options(await json_body(request))
        ticket = tickets.issue(rental_id, stack_id, container, options)
        scheme = "wss" if request.secure else "ws"
        url = f"{scheme}://{request.host}/v1/terminals/{ticket.terminal_id}?token={ticket.token}"
        log.info("terminal_ticket_issued", terminal_id=ticket.terminal_id, rental_id=rental_id, stack_id=stack_id)
        return web.json_response(
            {"terminalId": ticket.terminal_id, "url": url, "expiresAt": ticket.expires_at}, status=201
        )

    async def open_terminal(request: web.Request) -> web.StreamResponse:
        renter = web.WebSocketResponse(heartbeat=RENTER_HEARTBEAT, max_msg_size=RENTER_MAX_MESSAGE, timeout=5.0)
        if not renter.can_prepare(request).ok:
            return json_error(400, "this path is a WebSocket: send an Upgrade request")
        try:
            ticket = tickets.check(request.match_info["terminalId"], request.query.get("token"))
        except TicketRejected as rejected:
            return json_error(rejected.status, str(rejected))
        tickets.redeem(ticket)
        if not rental_active(store, ticket.rental_id):
            raise Conflict(f"rental {ticket.rental_id} has ended")
        await renter.prepare(request)
        log.info("terminal_opening", terminal_id=ticket.terminal_id, rental_id=ticket.rental_id)
        try:
            stream = await hub.open(
                "terminal",
                ticket.rental_id,
                {"stackId": ticket.stack_id, "containerId": ticket.container_id, **ticket.options},
            )
        except StreamRefused as refused:
            await _end_renter(
                renter, {"type": "end", "reason": "error", "status": refused.status, "error": refused.message}
            )
            return renter
        end = None
        try:
            if not rental_active(store, ticket.rental_id):
                stream.end("rental-ended")
            end = await _relay(renter, stream)
        finally:  # both sides at once: neither waits for the other's close handshake
            await asyncio.gather(hub.finish(stream), _end_renter(renter, end))
        return renter

    return [
        web.post("/v1/rentals/{rentalId}/stacks/{stackId}/containers/{containerId}/terminal", create_terminal),
        web.get(TERMINAL_ROUTE, open_terminal),
    ]


def resize_message(text: str) -> dict | None:
    """A renter's `{"type": "resize", "cols", "rows"}`, checked and rebuilt; None for anything else."""
    try:
        message = json.loads(text)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("type") != "resize":
        return None
    cols, rows = dimension(message.get("cols")), dimension(message.get("rows"))
    return {"type": "resize", "cols": cols, "rows": rows} if cols and rows else None


def end_message(text: str) -> dict | None:
    """The agent's `end`, passed on with the fields the protocol knows."""
    try:
        message = json.loads(text)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("type") != "end" or not isinstance(message.get("reason"), str):
        return None
    return {key: message[key] for key in ("type", "reason", "exitCode", "error") if key in message}


async def _relay(renter: web.WebSocketResponse, stream: Stream) -> dict | None:
    """Relay until one side ends; the `end` to tell the renter, None when the renter is gone."""
    agent = stream.agent_ws
    if agent is None:
        raise RuntimeError("relay before the agent's stream socket opened")

    async def keystrokes() -> None:  # renter -> agent
        async for message in renter:
            if message.type is WSMsgType.BINARY:
                await agent.send_bytes(message.data)
            elif message.type is WSMsgType.TEXT:
                resize = resize_message(message.data)
                if resize is not None:
                    await agent.send_json(resize)

    async def output() -> dict:  # agent -> renter
        while True:
            message = await agent.receive()
            if message.type is WSMsgType.BINARY:
                await renter.send_bytes(message.data)
            elif message.type is WSMsgType.TEXT:
                end = end_message(message.data)
                if end is not None:
                    return end
            else:
                return {"type": "end", "reason": "error", "error": "the agent's stream closed without ending"}

    async def ended() -> dict:
        await stream.ended.wait()
        return {"type": "end", "reason": stream.end_reason}

    try:
        first = await first_done(output(), ended(), keystrokes())
        return first.result()
    except (ConnectionError, RuntimeError):
        return None  # a socket broke: nothing more can be said on it


async def _end_renter(renter: web.WebSocketResponse, end: dict | None) -> None:
    """Tell the renter why (when there is anyone to tell), then close: 1011 after an error."""
    if end is None:
        await close_quietly(renter)
        return
    try:
        await asyncio.wait_for(renter.send_json(end), CLOSE_TIMEOUT)
    except (ConnectionError, RuntimeError, asyncio.TimeoutError):
        pass
    await close_quietly(renter, WSCloseCode.INTERNAL_ERROR if end["reason"] == "error" else WSCloseCode.OK)

"""Terminal tickets: what `POST .../terminal` hands out and `GET /v1/terminals/{id}` redeems.

A browser cannot set an API-key header on a WebSocket, so the renter's key
buys a ticket instead: a random token, valid once and for TICKET_SECONDS, that
the renter puts in the WebSocket URL. Creating a ticket costs the host
nothing: the agent is asked for the terminal only when the ticket is redeemed.
The tokens are registered with the log scrubber while they live, so a URL that
reaches a log line shows `***` in its place.
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from gpuhost_agent.common.logs import SECRETS
from gpuhost_agent.errors import Refusal
from gpuhost_agent.local_marketplace.http_errors import BadRequest, same_secret
from gpuhost_agent.protocol import wire_time, wire_values

TICKET_SECONDS = 60.0
DEFAULT_COMMAND = ["/bin/sh"]
DEFAULT_COLS, DEFAULT_ROWS = 80, 24
MAX_COMMAND_ITEMS = 64
MAX_ARGUMENT_CHARS = 4096
MAX_DIMENSION = 1000


class TicketRejected(Refusal):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Ticket:
    terminal_id: str
    token: str
    rental_id: str
    stack_id: str
    container_id: str
    options: dict  # command, cols, rows: the `terminal` request's fields
    expires: float  # time.monotonic()
    expires_at: str = field(default="")


def dimension(value: object) -> int | None:
    number = wire_values.whole(value, MAX_DIMENSION)
    return number if number else None


def terminal_options(body: Any) -> dict:
    """command, cols and rows from the optional body, defaults filled in; BadRequest (400) says what is wrong."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object (or empty)")
    command = body.get("command", DEFAULT_COMMAND)
    if (
        not isinstance(command, list)
        or not command
        or len(command) > MAX_COMMAND_ITEMS
        or not all(isinstance(item, str) for item in command)
    ):
        raise BadRequest(f"command must be a non-empty array of at most {MAX_COMMAND_ITEMS} strings")
    for item in command:
        if "\0" in item or len(item) > MAX_ARGUMENT_CHARS:
            raise BadRequest(f"command items must hold no NUL character and at most {MAX_ARGUMENT_CHARS} characters")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest("command items must be valid Unicode text") from None
    options: dict[str, Any] = {"command": list(command)}
    for name, default in (("cols", DEFAULT_COLS), ("rows", DEFAULT_ROWS)):
        value = dimension(body.get(name, default))
        if value is None:
            raise BadRequest(f"{name} must be a whole number from 1 to {MAX_DIMENSION}")
        options[name] = value
    return options


class TicketBook:
    def __init__(self, ttl: float = TICKET_SECONDS):
        self.ttl = ttl
        self._tickets: dict[str, Ticket] = {}

    def issue(self, rental_id: str, stack_id: str, container_id: str, options: dict) -> Ticket:
        self._expire()
        ticket = Ticket(
            terminal_id=str(uuid.uuid4()),
            token=secrets.token_urlsafe(32),
            rental_id=rental_id,
            stack_id=stack_id,
            container_id=container_id,
            options=options,
            expires=time.monotonic() + self.ttl,
            expires_at=wire_time.iso_from_timestamp(time.time() + self.ttl),
        )
        SECRETS.add(ticket.token)
        self._tickets[ticket.terminal_id] = ticket
        return ticket

    def check(self, terminal_id: str, token: str | None) -> Ticket:
        """The live ticket whose token this is; TicketRejected 404 (no such
        live ticket: unknown, used or expired) or 401 (wrong or missing token)."""
        self._expire()
        ticket = self._tickets.get(terminal_id)
        if ticket is None:
            raise TicketRejected(404, f"terminal {terminal_id[:64]} not found (unknown, already used or expired)")
        if not token or not same_secret(token, ticket.token):
            raise TicketRejected(401, "missing or invalid token")
        return ticket

    def redeem(self, ticket: Ticket) -> None:
        """Single use: gone once a renter has connected with it."""
        if self._tickets.pop(ticket.terminal_id, None) is not None:
            SECRETS.discard_many([ticket.token])

    def _expire(self) -> None:
        now = time.monotonic()
        for ticket in [t for t in self._tickets.values() if t.expires <= now]:
            self.redeem(ticket)

"""What the marketplace may ask on the channel, and whom the agent serves (pure).

docs/streams.md, section 2. Everything from the marketplace is checked here
before any of it reaches the engine: ids end up in Engine API paths, and a
marketplace bug (or a compromised one) must not open another renter's
container. What does not parse is refused here (400); whom the agent serves,
every other refusal, is streams/admission.py's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpuhost_agent import errors
from gpuhost_agent.protocol import wire_values

DEFAULT_COMMAND = ("/bin/sh",)
DEFAULT_COLS, DEFAULT_ROWS = 80, 24
MAX_COMMAND_ITEMS = 64
MAX_COMMAND_CHARS = 4096
MAX_TERMINAL_SIDE = 1000
MAX_SSH_STACKS = 64  # stacks one SSH endpoint (one rental) may name
_STREAM_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# A container's Id or Name (Docker's names may come with their leading "/").
_CONTAINER = re.compile(r"^/?[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class LogsRequest:
    stream_id: str
    rental_id: str
    stack_id: str
    container_id: str
    tail: int | None = None
    since: int | None = None
    timestamps: bool = False
    follow: bool = False


@dataclass(frozen=True)
class TerminalRequest:
    stream_id: str
    rental_id: str
    stack_id: str
    container_id: str
    command: tuple[str, ...] = DEFAULT_COMMAND
    cols: int = DEFAULT_COLS
    rows: int = DEFAULT_ROWS


@dataclass(frozen=True)
class TunnelRequest:
    """A byte stream to one TCP port the container declares (streams/tunnel.py)."""

    stream_id: str
    rental_id: str
    stack_id: str
    container_id: str
    port: int
    tls: bool = False  # the stack is `insecure`: TLS to the service, its certificate unverified


@dataclass
class SshLoginMark:
    """Where an `ssh` stream stands with its login, for the caps
    (streams/admission.py): until it logs in it holds one of the rental's few
    pre-login places, not its connection cap; one the channel ends to make
    room for a newer one is `dropped` and counts on neither."""

    logged_in: bool = False
    dropped: bool = False
    stack_id: str = ""  # the stack the login name picked, once logged in (the status socket counts it there)


@dataclass(frozen=True)
class SshRequest:
    """One renter's SSH connection to the rental's SSH endpoint (streams/ssh/server.py).
    No stack and no container: the login name picks both, after the
    handshake, among `stack_ids`, the rental's stacks the marketplace says are
    open to SSH (the marketplace relays ciphertext and never sees the name)."""

    stream_id: str
    rental_id: str
    stack_ids: tuple[str, ...]
    login: SshLoginMark = field(default_factory=SshLoginMark, compare=False, repr=False)


@dataclass(frozen=True)
class CancelRequest:
    stream_id: str


@dataclass(frozen=True)
class Refusal:
    """No stream will be opened. Without a stream id there is no one to tell."""

    stream_id: str | None
    status: int
    error: str

    def message(self) -> dict:
        return {"type": "refused", "streamId": self.stream_id, "status": self.status, "error": self.error}


Request = LogsRequest | TerminalRequest | TunnelRequest | SshRequest | CancelRequest | Refusal
StreamRequest = LogsRequest | TerminalRequest | TunnelRequest | SshRequest  # what opens a stream
ContainerRequest = LogsRequest | TerminalRequest | TunnelRequest  # those that name their container


class _Bad(errors.Refusal, ValueError):
    pass


def parse_request(message: Any) -> Request:
    if not isinstance(message, dict):
        return Refusal(None, 400, "a channel message must be a JSON object")
    stream_id = message.get("streamId")
    if not (isinstance(stream_id, str) and _STREAM_ID.fullmatch(stream_id)):
        return Refusal(None, 400, "streamId must be 1 to 64 characters of A-Z a-z 0-9 _ -")
    kind = message.get("type")
    try:
        if kind == "cancel":
            return CancelRequest(stream_id)
        if kind == "logs":
            return LogsRequest(
                stream_id,
                *_target(message),
                tail=_whole(message, "tail"),
                since=_whole(message, "since"),
                timestamps=_flag(message, "timestamps"),
                follow=_flag(message, "follow"),
            )
        if kind == "terminal":
            return TerminalRequest(
                stream_id,
                *_target(message),
                command=_command(message),
                cols=_side(message, "cols", DEFAULT_COLS),
                rows=_side(message, "rows", DEFAULT_ROWS),
            )
        if kind == "tunnel":
            return TunnelRequest(stream_id, *_target(message), port=_port(message), tls=_flag(message, "tls"))
        if kind == "ssh":
            return SshRequest(stream_id, *_ssh_stacks(message))
    except _Bad as exc:
        return Refusal(stream_id, 400, str(exc))
    return Refusal(stream_id, 400, f"unknown request type {str(kind)[:40]!r}")


def kind_of(request: StreamRequest) -> str:
    """The request's `type` on the channel, which logs and status counts name it by."""
    if isinstance(request, LogsRequest):
        return "logs"
    if isinstance(request, SshRequest):
        return "ssh"
    return "terminal" if isinstance(request, TerminalRequest) else "tunnel"


def parse_resize(message: Any) -> tuple[int, int] | None:
    """(cols, rows) of a terminal's {"type": "resize"} message; None for anything else."""
    if not isinstance(message, dict) or message.get("type") != "resize":
        return None
    cols, rows = message.get("cols"), message.get("rows")
    if (
        wire_values.is_whole(cols, MAX_TERMINAL_SIDE)
        and wire_values.is_whole(rows, MAX_TERMINAL_SIDE)
        and cols
        and rows
    ):
        return cols, rows
    return None


def _id(message: dict, key: str) -> str:
    if not wire_values.is_safe_id(message.get(key)):
        raise _Bad(f"{key} is missing or not an id")
    return message[key]


def _stack(message: dict) -> tuple[str, str]:
    return _id(message, "rentalId"), _id(message, "stackId")


def _ssh_stacks(message: dict) -> tuple[str, tuple[str, ...]]:
    """The rental and its stacks a login may pick: `stackIds`, or one
    `stackId` (a marketplace that keeps an endpoint per stack)."""
    if "stackIds" not in message:
        rental_id, stack_id = _stack(message)
        return rental_id, (stack_id,)
    rental = _id(message, "rentalId")
    stack_ids = message["stackIds"]
    if not (
        isinstance(stack_ids, list)
        and 0 < len(stack_ids) <= MAX_SSH_STACKS
        and all(wire_values.is_safe_id(stack_id) for stack_id in stack_ids)
    ):
        raise _Bad(f"stackIds must be 1 to {MAX_SSH_STACKS} stack ids")
    return rental, tuple(dict.fromkeys(stack_ids))


def _target(message: dict) -> tuple[str, str, str]:
    rental_id, stack_id = _stack(message)
    container = message.get("containerId")
    if not (isinstance(container, str) and _CONTAINER.fullmatch(container)):
        raise _Bad("containerId is missing or not a container id or name")
    return rental_id, stack_id, container.lstrip("/")


def _port(message: dict) -> int:
    port = message.get("port")
    if not (wire_values.is_whole(port, 65535) and port >= 1):
        raise _Bad("port must be a TCP port, 1 to 65535")
    return port


def _whole(message: dict, key: str) -> int | None:
    value = message.get(key)
    if value is None:
        return None
    if not wire_values.is_whole(value, 2**53):
        raise _Bad(f"{key} must be a whole number >= 0")
    return value


def _flag(message: dict, key: str) -> bool:
    value = message.get(key, False)
    if not isinstance(value, bool):
        raise _Bad(f"{key} must be true or false")
    return value


def _command(message: dict) -> tuple[str, ...]:
    command = message.get("command")
    if command is None:
        return DEFAULT_COMMAND
    if not (
        isinstance(command, list)
        and 0 < len(command) <= MAX_COMMAND_ITEMS
        and all(isinstance(part, str) and len(part) <= MAX_COMMAND_CHARS and "\x00" not in part for part in command)
    ):
        raise _Bad(f"command must be 1 to {MAX_COMMAND_ITEMS} strings of at most {MAX_COMMAND_CHARS} characters")
    return tuple(command)


def _side(message: dict, key: str, default: int) -> int:
    value = message.get(key)
    if value is None:
        return default
    if not (wire_values.is_whole(value, MAX_TERMINAL_SIDE) and value >= 1):
        raise _Bad(f"{key} must be a whole number from 1 to {MAX_TERMINAL_SIDE}")
    return value

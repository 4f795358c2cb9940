"""How many channels an SSH connection, and all of one rental's SSH
connections together, may hold open (pure; docs/streams.md, "ssh").

One login could otherwise open thousands of channels: sessions (each a
Docker exec in the container, or an SFTP/SCP helper) and `ssh -L`
connections (each a socket to a container). Each connection has caps of its
own, OpenSSH's own default of 10 sessions (MaxSessions) and 64 forwards, and
the rental a higher cap over all its connections, so that a renter's
channels are bounded whatever number of connections carry them (limits.py
bounds those), and one rental's channels never leave another rental without
any. A channel past a cap is refused at its opening, with the reason
(`administratively prohibited: at most 10 sessions per SSH connection ...`),
and nothing already open is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuhost_agent.errors import Refusal

SESSION, FORWARD = "session", "forward"
_NAMES = {SESSION: "sessions (shells, commands, SFTP or SCP)", FORWARD: "ssh -L connections"}


@dataclass(frozen=True)
class ChannelCaps:
    sessions_per_connection: int = 10
    forwards_per_connection: int = 64
    sessions_per_rental: int = 32
    forwards_per_rental: int = 256

    def per_connection(self, kind: str) -> int:
        return self.sessions_per_connection if kind == SESSION else self.forwards_per_connection

    def per_rental(self, kind: str) -> int:
        return self.sessions_per_rental if kind == SESSION else self.forwards_per_rental


class ChannelRefused(Refusal):
    """A channel past a cap; the message is what the client is told."""


@dataclass
class ChannelLedger:
    """The open channels of every rental, for all the agent's SSH connections."""

    caps: ChannelCaps = field(default_factory=ChannelCaps)
    _rentals: dict[tuple[str, str], int] = field(default_factory=dict)

    def connection(self, rental_id: str) -> ConnectionChannels:
        return ConnectionChannels(self, rental_id)

    def open(self, rental_id: str, kind: str) -> int:
        return self._rentals.get((rental_id, kind), 0)

    def _add(self, rental_id: str, kind: str, count: int) -> None:
        total = self._rentals.get((rental_id, kind), 0) + count
        if total > 0:
            self._rentals[(rental_id, kind)] = total
        else:
            self._rentals.pop((rental_id, kind), None)


class Slot:
    """One open channel's place; release() is idempotent."""

    def __init__(self, owner: ConnectionChannels, kind: str):
        self._owner, self.kind, self._held = owner, kind, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._owner._give_back(self)


class ConnectionChannels:
    """The channels of one SSH connection."""

    def __init__(self, ledger: ChannelLedger, rental_id: str):
        self._ledger, self._rental_id = ledger, rental_id
        self._slots: set[Slot] = set()

    def open(self, kind: str) -> int:
        return sum(1 for slot in self._slots if slot.kind == kind)

    def take(self, kind: str) -> Slot:
        """A place for one more channel of `kind`, or ChannelRefused saying which cap."""
        caps, what = self._ledger.caps, _NAMES[kind]
        if self.open(kind) >= caps.per_connection(kind):
            raise ChannelRefused(
                f"at most {caps.per_connection(kind)} {what} per SSH connection: close one, or open another connection"
            )
        if self._ledger.open(self._rental_id, kind) >= caps.per_rental(kind):
            raise ChannelRefused(
                f"this rental has {caps.per_rental(kind)} {what} open over its SSH connections,"
                " the most one rental may hold: close one"
            )
        slot = Slot(self, kind)
        self._slots.add(slot)
        self._ledger._add(self._rental_id, kind, 1)
        return slot

    def _give_back(self, slot: Slot) -> None:
        if slot in self._slots:
            self._slots.discard(slot)
            self._ledger._add(self._rental_id, slot.kind, -1)

    def close(self) -> None:
        """The connection ended: whatever it still held is given back."""
        for slot in list(self._slots):
            slot.release()

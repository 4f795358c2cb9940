"""What the agent's marketplace session says right now: the environment's id,
whether the marketplace answers, and since when.

One object, built by the composition root and handed to every part that needs
the environment's id (the rental clock, reconcile, the stream channel): they
read it when they act, because it is known only once the first session opens,
or, after a restart, from the state database (so that rentals still end on
time while the marketplace is away).
"""

from __future__ import annotations

import asyncio

from gpuhost_agent.protocol import wire_time


class SessionState:
    def __init__(self, env_id: str | None = None):
        self.env_id = env_id
        self.connected = asyncio.Event()
        self.connected_since: str | None = None
        self.reconnects = 0
        self.conflict: str | None = None  # why the agent cannot hold its session (another agent on the key)
        self.unreachable: str | None = None  # why the last try to open a session found no marketplace to answer

    def current_env_id(self) -> str | None:
        """For parts that take a callable: the id as it is when they ask."""
        return self.env_id

    def opened(self, env_id: str | None) -> None:
        """A session opened; a reply without a usable id keeps the one we had."""
        if env_id:
            self.env_id = env_id
        self.connected_since = wire_time.iso()
        self.unreachable = None
        self.connected.set()

    def lost(self) -> None:
        self.connected.clear()
        self.connected_since = None

    def back(self) -> None:
        """The marketplace answers again after failures."""
        self.reconnects += 1
        self.connected_since = wire_time.iso()
        self.connected.set()

    def stats(self) -> dict:
        return {
            "connected": self.connected.is_set(),
            "connectedSince": self.connected_since,
            "reconnects": self.reconnects,
            "envId": self.env_id,
            "conflict": self.conflict,
        }

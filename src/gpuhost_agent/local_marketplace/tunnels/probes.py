"""Background readiness probes of the tunnels still `starting` (docs/streams.md,
section 4), so a tunnel's status turns `ready` with nobody connecting.

One prober per stack with `starting` tunnels: one TCP connection through the
agent's tunnel path at a time, closed at once, the rounds further apart each
time (0.5 s doubling up to 30 s), and at most PROBES_PER_STACK probes per
stack altogether, so a service that never listens costs a bounded number of
streams. Apart from tunnels.py (the listeners and their relays) because this
is a policy of its own with its own state (the budgets); the book asks it to
start, to forget the stacks that went, and to stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from functools import partial
from typing import Generic, Protocol, TypeVar

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.local_marketplace.channel_hub import ChannelHub, StreamRefused
from gpuhost_agent.local_marketplace.tunnels import relay as tunnel_relay

log = get_logger(__name__)

PROBES_PER_STACK = 24  # background probes of a stack's `starting` tunnels, all together
PROBE_FIRST_DELAY = 0.5  # seconds before the second round; doubled each round
PROBE_MAX_DELAY = 30.0
PROBED = frozenset({"http", "tcp"})  # not an SSH endpoint: it is `ready` once the host key is known


class _Key(Protocol):
    @property
    def rental_id(self) -> str: ...
    @property
    def stack_id(self) -> str: ...


class Probed(Protocol):
    """What a probe reads and sets of tunnels.Tunnel (not imported: the book imports this)."""

    protocol: str
    status: str
    error: str | None

    @property
    def key(self) -> _Key: ...
    @property
    def tunnel_id(self) -> str: ...


Tunnel = TypeVar("Tunnel", bound=Probed)


class TunnelProbes(Generic[Tunnel]):
    """The probers of the book's `starting` tunnels and what each stack may still probe."""

    def __init__(
        self,
        hub: ChannelHub,
        tunnels: Callable[[], Iterable[Tunnel]],
        fields: Callable[[Tunnel], dict[str, object]],
    ):
        self.hub = hub
        self._tunnels = tunnels  # the book's tunnels now
        self._fields = fields  # the stream request for one connection of a tunnel
        self._probers: dict[str, asyncio.Task] = {}  # stack id: the task probing its `starting` tunnels
        self.left: dict[str, int] = {}  # stack id: probes it may still make

    def forget(self, stacks: set[str]) -> None:
        """The budgets and probers of stacks not in `stacks` (their tunnels went)."""
        for stack_id in [s for s in self.left if s not in stacks]:
            self.left.pop(stack_id)
            if (prober := self._probers.pop(stack_id, None)) is not None:
                prober.cancel()

    def start(self) -> None:
        """One prober per stack with `starting` tunnels, while its probes last."""
        for tunnel in self._tunnels():
            stack_id = tunnel.key.stack_id
            if tunnel.protocol not in PROBED or tunnel.status != "starting" or stack_id in self._probers:
                continue
            if self.left.setdefault(stack_id, PROBES_PER_STACK) > 0:
                prober = asyncio.create_task(self._probe_stack(stack_id), name=f"probe {stack_id[:8]}")
                self._probers[stack_id] = prober
                prober.add_done_callback(partial(self._prober_done, stack_id))

    async def stop(self) -> None:
        for prober in list(self._probers.values()):
            prober.cancel()
        await asyncio.gather(*self._probers.values(), return_exceptions=True)

    def _prober_done(self, stack_id: str, prober: asyncio.Task) -> None:
        if self._probers.get(stack_id) is prober:
            del self._probers[stack_id]

    async def _probe_stack(self, stack_id: str) -> None:
        """Probe the stack's `starting` tunnels, one at a time, the rounds
        further apart each time, until none is starting or the probes are spent."""
        delay = PROBE_FIRST_DELAY
        while True:
            starting = [
                t
                for t in self._tunnels()
                if t.key.stack_id == stack_id and t.protocol in PROBED and t.status == "starting"
            ]
            for tunnel in starting:
                if self.left.get(stack_id, 0) <= 0:
                    log.info("tunnel_probes_spent", stack_id=stack_id, starting=len(starting))
                    return
                self.left[stack_id] -= 1
                await self._probe(tunnel)
            if not starting:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, PROBE_MAX_DELAY)

    async def _probe(self, tunnel: Tunnel) -> None:
        """One TCP connection to the service through the agent's tunnel path,
        closed at once: `ready` when it opens. Only a refusal that says the
        service does not listen yet keeps `starting`; any other (no agent
        connected, too many streams) changes nothing, the next probe or
        client will tell."""
        try:
            stream = await self.hub.open("tunnel", tunnel.key.rental_id, self._fields(tunnel))
        except StreamRefused as refused:
            if not tunnel_relay.is_not_listening(refused.status, refused.message):
                log.info("tunnel_probe_refused", tunnel_id=tunnel.tunnel_id, status=refused.status)
            return
        if tunnel.status == "starting":
            tunnel.status, tunnel.error = "ready", None
            log.info("tunnel_ready", tunnel_id=tunnel.tunnel_id, stack_id=tunnel.key.stack_id)
        await self.hub.finish(stream)

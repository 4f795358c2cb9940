"""The other machines' container events, followed by a Swarm environment's leader.

On one machine the container watch follows the engine's event stream, so a
container that stops is reported at once (core/containers/watch.py). A Swarm
manager's events cover only its own containers; each other machine's
engine tells its own, and its agent serves them to the leader (`GET
/events` on the door, cut to the agent's containers: streams/door.py).
The leader follows each machine's stream and hands every event to the same
container watch, which then reads the stack's containers from the manager's
tasks (and reads again while they still show running a container the event
said died). The manager's tasks, asked every few seconds (core/swarm/watch.py),
stay the fallback: a machine whose agent does not answer loses only the
immediacy.

One follow per machine, started by the leader's watch for the machines it
lists as ready; a follow that ends (the agent restarted, the machine went
away) is started again at the watch's next look, which spaces the retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.records import EngineEvent

log = get_logger(__name__)

# Follow one machine's events, handing each to the callable, until the stream ends.
FollowEvents = Callable[[str, Callable[[EngineEvent], None]], Awaitable[None]]


class WorkerEvents:
    def __init__(self, follow: FollowEvents, on_event: Callable[[EngineEvent], None]):
        self.follow, self.on_event = follow, on_event
        self._follows: dict[str, asyncio.Task] = {}  # node id -> its follow
        self._silent: set[str] = set()  # nodes whose last follow failed (said once until it works again)
        self.events = 0  # for tests and the status

    def keep(self, nodes: set[str]) -> None:
        """Follow exactly these machines: start what is missing or ended, end the others."""
        for node in list(self._follows):
            if node not in nodes:
                self._follows.pop(node).cancel()
        for node in sorted(nodes):
            task = self._follows.get(node)
            if task is None or task.done():
                self._follows[node] = asyncio.get_running_loop().create_task(self._run(node))

    async def _run(self, node: str) -> None:
        if node not in self._silent:  # a machine whose agent stays silent is tried every look, said once
            log.info("worker_events_following", node_id=node)
        try:
            await self.follow(node, lambda event: self._event(node, event))
            log.info("worker_events_ended", node_id=node, hint="followed again at the watch's next look")
        except EngineError as exc:
            if node not in self._silent:
                self._silent.add(node)
                log.warning("worker_events_unavailable", node_id=node, error=str(exc)[:300])

    def _event(self, node: str, event: EngineEvent) -> None:
        self._silent.discard(node)  # it works again: a later failure is said again
        self.events += 1
        self.on_event(event)

    async def stop(self) -> None:
        tasks = list(self._follows.values())
        self._follows.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

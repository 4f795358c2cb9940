"""The other machines' container events, followed by a Swarm leader
(core/swarm/worker_events.py): one follow per machine listed, every event handed
on, a follow that ended started again at the next look, machines no longer
listed no longer followed, and all of it ended at stop. The door's side, on
the real engine: tests/integration/test_door_engine.py."""

from __future__ import annotations

import asyncio

from gpuhost_agent.core.swarm.worker_events import WorkerEvents
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.streams.door_routes import events_head, route


class Machines:
    """Each node's stream: its events, then it ends, or it fails, or it stays open."""

    def __init__(self, behaviour: dict[str, str]):
        self.behaviour = behaviour
        self.follows: list[str] = []
        self.open: set[str] = set()

    async def follow(self, node: str, on_event) -> None:
        self.follows.append(node)
        how = self.behaviour[node]
        if how == "fails":
            raise EngineError("the agent on this machine did not answer")
        on_event({"Action": "die", "Actor": {"ID": f"c-{node}"}})
        if how == "ends":
            return
        self.open.add(node)
        try:
            await asyncio.Event().wait()
        finally:
            self.open.discard(node)


async def test_each_machine_is_followed_once_its_events_handed_on_and_ended_follows_started_again() -> None:
    machines = Machines({"n2": "stays", "n3": "ends", "n4": "fails"})
    seen: list[dict] = []
    events = WorkerEvents(machines.follow, seen.append)
    events.keep({"n2", "n3", "n4"})
    await asyncio.sleep(0.05)
    assert sorted(machines.follows) == ["n2", "n3", "n4"] and machines.open == {"n2"}
    assert sorted(event["Actor"]["ID"] for event in seen) == ["c-n2", "c-n3"] and events.events == 2
    events.keep({"n2", "n3", "n4"})  # the next look: n3's and n4's follows ended, n2's still runs
    await asyncio.sleep(0.05)
    assert sorted(machines.follows) == ["n2", "n3", "n3", "n4", "n4"]
    events.keep({"n3"})  # n2 is no longer listed (down, or left the Swarm)
    await asyncio.sleep(0.05)
    assert machines.open == set()
    machines.behaviour["n3"] = "stays"
    events.keep({"n3"})
    await asyncio.sleep(0.05)
    assert machines.open == {"n3"}
    await events.stop()
    assert machines.open == set()


def test_the_door_asks_the_engine_for_the_agents_container_events_alone() -> None:
    assert route("GET", "/v1.45/events?filters=%7B%7D&since=0") == ("events", "")
    assert route("POST", "/events") is None
    head = events_head().decode()
    assert head.startswith("GET /events?filters=") and head.endswith("\r\n\r\n")
    assert "%22type%22%3A%20%5B%22container%22%5D" in head and "io.gpuhost.managed%3Dtrue" in head
    assert "since" not in head  # whatever the leader's query said

"""Inspect facts for the containers that stopped, read once per stop.

Docker's container list says a container exited, but its exit code only sits
in the Status text and whether the kernel's OOM killer did it is not there at
all. The inspect that tells is made once per container and exit, not on every
list (the periodic resync lists every stack every few seconds): facts are kept
by container id and the (state, code) the list shows, and an engine event for
the container forgets them, so a later stop with the same code is read again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict
from collections.abc import Callable

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.stacks.container_list import ExitFacts, exit_facts, needs_facts, status_exit_code
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.runtime.engine.records import ContainerSummary

log = get_logger(__name__)
MAX_KEPT = 4096


class ContainerStates:
    def __init__(
        self,
        engine: DockerEngine,
        *,
        max_kept: int = MAX_KEPT,
        rental_limit_reached: Callable[[str], bool],
    ):
        """`rental_limit_reached` says whether a rental's containers together
        reached the rental's memory limit since it was last asked
        (runtime/rental_cgroups.py): an OOM-killed container of such a rental
        was killed at the rental's limit, shared by all its containers, which
        Docker does not tell apart from the container's own."""
        self.engine = engine
        self.max_kept = max_kept
        self.rental_limit_reached = rental_limit_reached
        self.inspections = 0
        self._facts: OrderedDict[str, tuple[tuple, ExitFacts]] = OrderedDict()  # id -> (what the list showed, facts)

    async def facts(self, raw_list: list[ContainerSummary]) -> dict[str, ExitFacts]:
        """Facts by container id for the stopped containers of the list. A
        container gone meanwhile (or an engine that does not answer) just has
        none: its state is then shaped from the list entry alone."""
        found: dict[str, ExitFacts] = {}
        for raw in raw_list:
            if not needs_facts(raw) or not raw.get("Id"):
                continue
            key = (raw.get("State"), status_exit_code(raw))
            kept = self._facts.get(raw["Id"])
            facts = kept[1] if kept is not None and kept[0] == key else None
            if facts is None:
                try:
                    facts = exit_facts(await self.engine.container_state(raw["Id"]))
                except EngineError as exc:
                    log.debug("container_inspect_failed", container=raw["Id"][:12], error=str(exc))
                    continue
                self.inspections += 1
                if facts.oom_killed and (raw.get("Labels") or {}).get(wire.LABEL_RENTAL):
                    facts = await self._with_rental_limit(raw["Labels"][wire.LABEL_RENTAL], facts)
                self._keep(raw["Id"], key, facts)
            found[raw["Id"]] = facts
        return found

    async def _with_rental_limit(self, rental_id: str, facts: ExitFacts) -> ExitFacts:
        if not await asyncio.to_thread(self.rental_limit_reached, rental_id):
            return facts
        return dataclasses.replace(facts, rental_limit=True)

    def forget(self, container_id: str) -> None:
        """The container changed (an engine event): read it again next time."""
        self._facts.pop(container_id, None)

    def _keep(self, container_id: str, key: tuple, facts: ExitFacts) -> None:
        self._facts[container_id] = (key, facts)
        while len(self._facts) > self.max_kept:
            self._facts.popitem(last=False)

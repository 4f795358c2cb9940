"""Container state pushed on change, from the Docker Engine's event stream.

The periodic resync alone leaves the marketplace up to `containerResyncSeconds`
behind Docker. The agent follows the engine's events for its environment's
containers instead; the first event of a stack opens a window of `COALESCE`,
then the stack's list is read once and pushed through the outbox if it differs
from what was last pushed (the memory the resync shares, so neither pushes
what the other just did). A burst of events gives a handful of pushes.

A container of an APPLIED stack that stops by itself also re-sends the stack's
status, still APPLIED, with an errorMsg naming it; every container running
again clears it. Stops the agent causes never do: a stack with a job under
way (deploy, removal) or whose rental is ending is looked at again only when
the job is over, and then its record says whether it is still APPLIED. Only a
flush that events started may set an errorMsg: lists read for other reasons
(resync, a re-opened stream after an engine restart, which reconcile handles)
may only clear one.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.containers.coalesce import Coalescer
from gpuhost_agent.core.containers.events import WATCHED, decode_event, error_to_report, list_behind
from gpuhost_agent.core.containers.states import ContainerStates
from gpuhost_agent.core.stacks.container_list import seed_containers, stack_error, stack_id_of
from gpuhost_agent.core.stacks.dispatcher import JobDispatcher
from gpuhost_agent.core.stacks.status_reporter import StackRef, StatusReporter
from gpuhost_agent.inventory.machines import Machines
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.runtime.engine.records import ContainerSummary, EngineEvent
from gpuhost_agent.storage.agent_db import AgentDB

log = get_logger(__name__)

COALESCE = 0.05  # seconds from a stack's first event to reading its list
BUSY_RECHECK = 0.5  # a stack with a job under way is looked at again this often
REOPEN_FIRST, REOPEN_MAX = 0.5, 5.0  # the stream re-opened after a break, backing off
MAX_BEHIND = 40  # windows to wait for the list to show a death the events told (then the resync's turn)


class ContainerWatch:
    def __init__(
        self,
        engine: DockerEngine,
        reporter: StatusReporter,
        db: AgentDB,
        dispatcher: JobDispatcher,
        *,
        window: float = COALESCE,
        rental_limit_reached: Callable[[str], bool],
        machines: Machines,
    ):
        # The environment's machines: their words for containers on unwell ones (none on one machine).
        self.machines = machines
        self.engine, self.reporter, self.db, self.dispatcher, self.window = engine, reporter, db, dispatcher, window
        # The last list pushed per stack, shared by events and the resync.
        self.pushed: dict[str, list[wire.Container]] = {}
        self.states = ContainerStates(self.engine, rental_limit_reached=rental_limit_reached)
        self.events = self.flushes = self.pushes = self.errors_reported = 0  # for tests and the benchmark
        self._windows = Coalescer()
        self._seen_at: dict[str, float] = {}  # when the list last pushed for a stack was read
        self._died: dict[str, set[str]] = {}  # per stack: containers that died, until its list shows it
        self._behind: dict[str, int] = {}  # per stack: lists read since then that still showed them running
        self._env_id: str | None = None
        self._end_stream: Any = None
        self._generation = 0
        self._failures, self._opened_at = 0, 0.0
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._reopen: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self._stopped = False

    # ---- the stream ------------------------------------------------------------
    def follow(self, env_id: str) -> None:
        """Follow this environment's containers (a no-op when already doing so)."""
        if env_id == self._env_id and (self._end_stream is not None or self._reopen is not None):
            return
        self._close_stream()
        self._env_id, self._stopped = env_id, False
        self._open()

    def engine_back(self) -> None:
        """The engine answers again: every list is pushed again (what the
        marketplace has may be stale), and the stream re-opens now rather than
        at the next backoff step."""
        self.pushed.clear()
        if self._env_id and self._end_stream is None and not self._stopped:
            self._failures = 0
            self._open()

    def stop(self) -> None:
        self._stopped = True
        self._close_stream()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._windows.clear()
        for task in self._tasks:
            task.cancel()

    def _open(self) -> None:
        loop = asyncio.get_running_loop()
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        self._generation += 1
        generation, self._opened_at = self._generation, loop.time()
        env_id = self._env_id
        if env_id is None:
            return  # nothing to follow before the environment is known
        self._end_stream = self.engine.watch_container_events(
            env_id,
            lambda event: loop.call_soon_threadsafe(self._on_event, generation, event),
            lambda: loop.call_soon_threadsafe(self._broke, generation),
        )
        log.debug("container_events_following", env_id=self._env_id, attempt=self._failures + 1)
        if self._failures <= 1:  # catch up on what happened while nothing followed (once per outage)
            self._spawn(self.resync(self._env_id))

    def _close_stream(self) -> None:
        self._generation += 1  # whatever the old stream still hands over is ignored
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        if self._end_stream is not None:
            self._end_stream()
            self._end_stream = None

    def _broke(self, generation: int) -> None:
        if generation != self._generation or self._stopped:
            return
        loop = asyncio.get_running_loop()
        self._end_stream = None
        if loop.time() - self._opened_at > REOPEN_MAX:
            self._failures = 0  # it ran for a while: this is a new outage
        delay = min(REOPEN_MAX, REOPEN_FIRST * 2**self._failures)
        if not self._failures:
            log.info("container_events_lost", retry_in_s=delay, hint="the Docker Engine stopped or restarted")
        self._failures += 1
        self._reopen = loop.call_later(delay, self._reopen_now)

    def _reopen_now(self) -> None:
        self._reopen = None
        if not self._stopped and self._end_stream is None and self._env_id:
            self._open()

    # ---- events, coalesced per stack -------------------------------------------
    def other_machine_event(self, event: EngineEvent) -> None:
        """An event of another machine's engine (a Swarm leader: core/swarm/worker_events.py)."""
        self._on_event(self._generation, event)

    def _on_event(self, generation: int, event: EngineEvent) -> None:
        if generation != self._generation or self._stopped:
            return
        action, container_id, attributes = decode_event(event)
        if action not in WATCHED or attributes.get(wire.LABEL_ENV) != self._env_id:
            return
        self.events += 1
        self.states.forget(container_id)
        stack_id = attributes.get(wire.LABEL_STACK)
        if stack_id and action == "die":
            self._died.setdefault(stack_id, set()).add(container_id)
        elif stack_id and action in ("start", "restart", "destroy"):
            self._died.get(stack_id, set()).discard(container_id)
        log.debug(
            "container_event",
            container=attributes.get("name"),
            action=action,
            stack_id=stack_id,
            exit_code=attributes.get("exitCode"),
        )
        if stack_id and self._windows.event(stack_id):
            self._schedule(stack_id, self.window)

    def _schedule(self, stack_id: str, delay: float) -> None:
        self._timers[stack_id] = asyncio.get_running_loop().call_later(delay, self._start_flush, stack_id)

    def _start_flush(self, stack_id: str) -> None:
        self._timers.pop(stack_id, None)
        self._windows.begin(stack_id)
        self._spawn(self._flush(stack_id))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, stack_id: str) -> None:
        again: float | None = None  # look again after this long
        try:
            seen_at = asyncio.get_running_loop().time()
            self.flushes += 1
            raw = await self.engine.stack_containers(stack_id)
            if not await self.push(stack_id, raw, seen_at, may_set_error=True):
                again = BUSY_RECHECK
            elif self._still_behind(stack_id, raw):
                again = self.window
        except EngineError as exc:
            log.warning("container_list_failed", stack_id=stack_id, error=str(exc))
        except Exception:  # a bug in one flush must not stop the stack's next ones
            log.exception("container_flush_failed", stack_id=stack_id)
        finally:
            if self._windows.end(stack_id, again=again is not None) and not self._stopped:
                self._schedule(stack_id, again or self.window)

    def _still_behind(self, stack_id: str, raw: list[ContainerSummary]) -> bool:
        died = self._died.get(stack_id, set()) & {container.get("Id") for container in raw}
        behind = list_behind(raw, died)
        self._behind[stack_id] = self._behind.get(stack_id, 0) + 1 if behind else 0
        if not behind or self._behind[stack_id] > MAX_BEHIND:
            self._died.pop(stack_id, None)
            self._behind.pop(stack_id, None)
            return False
        self._died[stack_id] = died
        return True

    # ---- pushing -----------------------------------------------------------------
    async def resync(self, env_id: str | None) -> None:
        """Every stack of the environment, read in one list: the periodic safety
        net, and the catch-up after the stream was (re)opened."""
        if not env_id:
            return
        seen_at = asyncio.get_running_loop().time()
        try:
            managed = await self.engine.environment_containers(env_id)
        except EngineError as exc:
            log.warning("container_resync_failed", error=str(exc))
            return
        by_stack: dict[str, list[ContainerSummary]] = {}
        for raw in managed:
            if stack_id := stack_id_of(raw):
                by_stack.setdefault(stack_id, []).append(raw)
        for stack_id, stack_raw in by_stack.items():
            await self.push(stack_id, stack_raw, seen_at, may_set_error=False)
        for gone in set(self.pushed) - set(by_stack):
            self.pushed.pop(gone, None)

    async def push(self, stack_id: str, raw: list[ContainerSummary], seen_at: float, *, may_set_error: bool) -> bool:
        """Push the stack's list (read at `seen_at`) if it changed; False when the
        stack has a job under way (that job reports, and it is looked at after)."""
        if self._busy(stack_id, raw):
            return False
        facts = await self.states.facts(raw)
        if self._busy(stack_id, raw):  # checked again: a job may have started meanwhile
            return False
        if seen_at < self._seen_at.get(stack_id, float("-inf")):
            return True  # a newer read of this stack was pushed meanwhile
        shaped = seed_containers(raw, facts)
        if not raw:  # removed: REMOVED drops the list at the marketplace
            self.pushed.pop(stack_id, None)
            self._seen_at.pop(stack_id, None)
        elif self.pushed.get(stack_id) != shaped:
            self.pushed[stack_id], self._seen_at[stack_id] = shaped, seen_at
            self.reporter.containers(stack_id, shaped)
            self.pushes += 1
        errors = (self.machines.stack_error(raw), stack_error(raw, facts))
        self._report_error(stack_id, "; ".join(error for error in errors if error), may_set_error)
        return True

    def _busy(self, stack_id: str, raw: list[ContainerSummary]) -> bool:
        if stack_id in self.dispatcher.busy_stacks():
            return True
        rentals = {(container.get("Labels") or {}).get(wire.LABEL_RENTAL) for container in raw}
        return bool(rentals & self.dispatcher.ending_rentals())

    def _report_error(self, stack_id: str, error: str, may_set: bool) -> None:
        record = self.db.stacks().get(stack_id)
        error_msg = error_to_report(record, error, may_set=may_set)
        if error_msg is None or record is None:
            return
        stack = StackRef(stack_id, record["rental_id"], record["env_id"], record["project"])
        self.reporter.status(stack, wire.APPLIED, error_msg, job_id=f"container-{uuid.uuid4().hex[:12]}")
        self.errors_reported += 1
        log.info(
            "stack_container_stopped" if error_msg else "stack_containers_running",
            stack_id=stack_id,
            rental_id=record["rental_id"],
            error=error_msg or None,
        )

"""How a stack runs: the one interface the deployer (core/stacks/deployer.py) goes
through, whichever engine runs the stack.

A deploy is the same steps on one machine and on a Swarm environment: the
renter's file read by Compose (`config`), judged and hardened by the
sandbox, labelled, written down, started, watched until it runs, and taken
down again when anything fails. What differs is only how a stack starts,
when it counts as running and how it goes; that is a backend's. The
composition root picks one (service/topology.py): Compose on one machine
(core/stacks/compose_backend.py), `docker stack` on a Swarm environment's leader
(core/swarm/backend.py). Nothing else asks which.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from gpuhost_agent.core.compose_values import ComposeModel
from gpuhost_agent.core.sandbox.raw import RawReview
from gpuhost_agent.runtime.engine.records import ContainerSummary

ListContainers = Callable[[], Awaitable[list[ContainerSummary]]]


class StackStart(Protocol):
    """A stack on its way up: Compose's model of the renter's file and the
    engine's names that are not the project's (what the sandbox judges), and
    the start of the hardened file once it is written."""

    model: ComposeModel
    foreign_names: frozenset[str]

    async def run(self, stack_id: str, text: str, stack: ComposeModel) -> None:
        """Start `text` (the hardened `stack`, as written down); StackFailed
        or EngineError when it does not start."""

    async def discard(self) -> None:
        """Nothing more will be started (the sandbox refused, or anything
        failed first): leave nothing behind."""


class StackBackend(Protocol):
    async def prepare(self, project: str, original: Path, variables: dict[str, str], raw: RawReview) -> StackStart:
        """The start of a deploy of the renter's file `original` (in the
        stack's folder): its model, the foreign names, and what starts it.
        The sandbox's refusal when Compose cannot read the file."""
        ...

    def stack_file(self, labelled: ComposeModel) -> ComposeModel:
        """The hardened, labelled stack in the form this backend starts."""
        ...

    async def until_running(self, stack_id: str) -> list[ContainerSummary]:
        """The stack's containers once the engine says they were started
        (StackFailed naming one that did not start)."""
        ...

    async def take_down_failed(self, project: str, workdir: Path, stack_id: str) -> None:
        """Whatever a failed deploy started goes, at once."""
        ...

    async def take_down(self, list_containers: ListContainers, workdir: Path, fallback: set[str]) -> set[str]:
        """Every project (stack) the listed containers belong to, or the
        fallback ones when none is left, taken down; returns those projects."""
        ...

    async def stop(self, projects: list[str], running: list[ContainerSummary]) -> None:
        """A rental's stacks `projects`, whose `running` containers these
        are, stopped and kept stopped, their definitions, networks and
        volumes kept (the disk watch stops a rental over its share)."""
        ...

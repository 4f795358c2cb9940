"""Where a stack's services run, as the sandbox decides it (core/sandbox/apply.py).

On one machine everything runs here: the hardened model is the stack as it
runs, and the rental's share is of this machine. On a Swarm environment the
rental's GPUs may be on several machines: the hardened model is written for
`docker stack deploy`, each service pinned to the machine of its GPUs, with
the rental's share of each machine (core/swarm/placement.py). The sandbox
is given one `Placement` by the composition root and does not ask which.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gpuhost_agent.core.compose_values import ComposeModel
from gpuhost_agent.core.sandbox.context import SandboxContext
from gpuhost_agent.protocol.wire_system import SystemData

Share = tuple[float, int]  # (cpus, memory bytes)


class PlacementPlan(Protocol):
    """One deploy's placement, once what it looked up (before the sandbox's
    atomic decision) is known. Both steps run inside that decision: no await."""

    def shares(self, facts: SystemData, gpu_nodes: Mapping[str, str], uuids: list[str]) -> dict[str, Share]:
        """The rental's share of each machine it has GPUs on, where machines
        differ (empty: the one share of this machine)."""
        ...

    def place(
        self,
        hardened: ComposeModel,
        ctx: SandboxContext,
        facts: SystemData,
        gpu_nodes: Mapping[str, str],
        base_share: Share,
        shares: Mapping[str, Share],
    ) -> tuple[ComposeModel, list[str]]:
        """The hardened model as the stack runs, and notices; StackRejected
        when it cannot run where its GPUs are."""
        ...


class Placement(Protocol):
    async def plan(self, rental_id: str, project: str) -> PlacementPlan:
        """The placement of `project`, a stack of the rental, being deployed."""
        ...


class OneMachinePlacement:
    """Everything on this machine: the hardened model is the stack."""

    async def plan(self, rental_id: str, project: str) -> OneMachinePlacement:
        return self

    def shares(self, facts: SystemData, gpu_nodes: Mapping[str, str], uuids: list[str]) -> dict[str, Share]:
        return {}

    def place(
        self,
        hardened: ComposeModel,
        ctx: SandboxContext,
        facts: SystemData,
        gpu_nodes: Mapping[str, str],
        base_share: Share,
        shares: Mapping[str, Share],
    ) -> tuple[ComposeModel, list[str]]:
        return hardened, []

"""The placement of a Swarm environment's stack (core/sandbox/placement.py): each
GPU service pinned to the machine of its GPUs, every other service to the
leader's, with the rental's share of each machine (core/swarm/stack_file.py).
The rental's services already running per machine (other stacks) share
that share, so they are counted before the sandbox decides."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from gpuhost_agent.core.compose_values import ComposeModel
from gpuhost_agent.core.sandbox.context import SandboxContext
from gpuhost_agent.core.sandbox.placement import Share
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.core.swarm.machine_shares import machine_shares, machines_floor_problem
from gpuhost_agent.core.swarm.stack_file import SwarmPlacement, stack_nodes, swarm_stack
from gpuhost_agent.protocol.wire_system import SystemData

RentalPeers = Callable[[str, str], Awaitable[dict[str, int]]]  # (rental, project) -> its other containers per node


class SwarmPlacer:
    def __init__(self, rental_peers: RentalPeers, *, encrypted: bool = False, disk_floor_bytes: int = 0):
        """`rental_peers` (runtime/swarm_engine.py) counts the rental's other
        containers per machine; `encrypted` makes the stack's overlays
        encrypted (IPsec between machines); a machine the stack would run on
        with less free disk than `disk_floor_bytes` refuses it."""
        self.rental_peers, self.encrypted, self.disk_floor_bytes = rental_peers, encrypted, disk_floor_bytes

    async def plan(self, rental_id: str, project: str) -> SwarmPlan:
        return SwarmPlan(await self.rental_peers(rental_id, project), self.encrypted, self.disk_floor_bytes)


@dataclass
class SwarmPlan:
    peers: Mapping[str, int]
    encrypted: bool
    disk_floor_bytes: int

    def shares(self, facts: SystemData, gpu_nodes: Mapping[str, str], uuids: list[str]) -> dict[str, Share]:
        return machine_shares(facts, gpu_nodes, uuids)

    def place(
        self,
        hardened: ComposeModel,
        ctx: SandboxContext,
        facts: SystemData,
        gpu_nodes: Mapping[str, str],
        base_share: Share,
        shares: Mapping[str, Share],
    ) -> tuple[ComposeModel, list[str]]:
        """Written for `docker stack deploy`, placed by the ledger."""
        host = facts.get("host") or {}
        home = str((((host.get("docker") or {}).get("swarm")) or {}).get("nodeId") or "")
        placement = SwarmPlacement(
            gpu_nodes, home, self.peers, encrypted=self.encrypted, shares=shares, base_share=base_share
        )
        stack, notices = swarm_stack(hardened, ctx, placement)
        full = machines_floor_problem(facts, stack_nodes(stack), self.disk_floor_bytes)
        if full:
            raise StackRejected(full)
        return stack, notices

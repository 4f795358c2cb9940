"""The rental's share of the machine as the kernel holds it: its cgroup.

On one machine each rental's containers run under a cgroup of the rental's
own (runtime/rental_cgroups.py), so its containers together stay within
the rental's share. A Swarm environment's leader has none: Swarm has no
`cgroup_parent`, and the Swarm rewrite divides the share among the
services instead (core/swarm/stack_file.py). Both are a `RentalShares`: the
sandbox, the deployer and the container watch use whichever the
composition root gave them, without asking which.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.protocol.wire_system import DockerFacts
from gpuhost_agent.runtime.rental_cgroups import CgroupError, RentalCgroups, RentalLimits

log = get_logger(__name__)


class RentalShares(Protocol):
    async def parent(self, docker: DockerFacts, rental_id: str) -> str | None:
        """The rental's cgroup parent (None: none is used), with the cgroups
        configured for the engine's driver and version (`docker`, the probe's
        facts) first; StackRejected when it cannot be made."""
        ...

    async def apply(self, rental_id: str, limits: RentalLimits) -> None:
        """The rental's limits written to its cgroup; CgroupError when they cannot be."""
        ...

    async def remove(self, rental_id: str) -> None:
        """The rental has ended: its cgroup goes."""
        ...

    def memory_limit_reached(self, rental_id: str) -> bool:
        """Whether the rental's shared memory limit was what killed a container."""
        ...


class CgroupShares:
    """Each rental in a cgroup of its own (one machine)."""

    def __init__(self, cgroups: RentalCgroups):
        self.cgroups = cgroups
        self._layout: tuple | None = None  # (driver, version) the cgroups were configured for
        self._configuring = asyncio.Lock()

    async def parent(self, docker: DockerFacts, rental_id: str) -> str | None:
        layout = (docker.get("cgroupDriver") or "", str(docker.get("cgroupVersion") or ""))
        async with self._configuring:  # concurrent deploys wait for the one that configures
            if layout != self._layout:
                why_not = await asyncio.to_thread(self.cgroups.configure, *layout)
                self._layout = layout
                if why_not:
                    log.warning("rental_cgroups_unavailable", reason=why_not)
                else:
                    log.info("rental_cgroups_used", cgroup_driver=layout[0], cgroup_version=layout[1])
        try:
            return self.cgroups.parent_of(rental_id)
        except CgroupError as exc:
            raise StackRejected(str(exc)) from None

    async def apply(self, rental_id: str, limits: RentalLimits) -> None:
        await asyncio.to_thread(self.cgroups.apply, rental_id, limits)

    async def remove(self, rental_id: str) -> None:
        if self.cgroups.version is not None:
            await asyncio.to_thread(self.cgroups.remove, rental_id)

    def memory_limit_reached(self, rental_id: str) -> bool:
        return self.cgroups.memory_limit_reached(rental_id)


class NoRentalCgroups:
    """No rental cgroup (a Swarm leader): each container has the limits the
    sandbox wrote into the stack, nothing more."""

    async def parent(self, docker: DockerFacts, rental_id: str) -> str | None:
        return None

    async def apply(self, rental_id: str, limits: RentalLimits) -> None:
        """Nothing to write: there is no cgroup."""

    async def remove(self, rental_id: str) -> None:
        """Nothing to remove."""

    def memory_limit_reached(self, rental_id: str) -> bool:
        return False

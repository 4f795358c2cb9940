"""The sandbox around one stack deploy: the pure policy, the rental's GPUs and
share of the machine, and the hardened model that Compose will run.

The GPU decision is made and recorded without an `await` in between (plan,
check, commit), so two rentals deploying at once can never be given the same
GPU.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gpuhost_agent.core.compose_rewrite import StackRejected
from gpuhost_agent.core.gpu_allocation import NotEnoughGpus, slots_from_inventory
from gpuhost_agent.core.gpu_ledger import GpuLedger
from gpuhost_agent.core.sandbox_context import DEFAULT_PIDS_LIMIT, Machine, SandboxContext, rental_share
from gpuhost_agent.core.sandbox_harden import harden
from gpuhost_agent.core.sandbox_policy import policy_violations
from gpuhost_agent.core.sandbox_raw import raw_violations
from gpuhost_agent.protocol import wire

POLICY_PREFIX = "refused by the sandbox policy: "
MachineFacts = Callable[[], Awaitable[dict]]  # a systemData dict: {"nvml": ..., "host": ...}


def refuse_raw(content: str) -> None:
    try:
        problems = raw_violations(content)
    except ValueError as exc:
        raise StackRejected(f"invalid Compose file: {exc}") from None
    if problems:
        raise StackRejected(POLICY_PREFIX + "; ".join(problems))


class Sandbox:
    def __init__(
        self,
        ledger: GpuLedger,
        machine_facts: MachineFacts,
        *,
        publish_address: str = "0.0.0.0",
        pids_limit: int = DEFAULT_PIDS_LIMIT,
    ):
        self.ledger = ledger
        self.machine_facts = machine_facts
        self.publish_address = publish_address
        self.pids_limit = pids_limit

    async def apply(self, job: wire.StackJob, project: str, model: dict) -> tuple[dict, list[str]]:
        """(the hardened model, the rental's GPUs) or StackRejected with the reasons."""
        if self.ledger.is_over(job.rental_id):
            raise StackRejected("the rental has ended; its stacks cannot be deployed again")
        facts = await self.machine_facts()
        slots = slots_from_inventory(facts.get("nvml") or {})
        host = facts.get("host") or {}
        machine = Machine(
            cpus=int((host.get("cpu") or {}).get("logicalCores") or 1),
            memory_bytes=int((host.get("memory") or {}).get("totalBytes") or 0),
            gpus=len(slots),
        )
        # From here to commit: no await, so the decision is atomic.
        try:
            uuids = self.ledger.plan(slots, job.rental_id, job.gpu_count)
        except NotEnoughGpus as exc:
            raise StackRejected(str(exc)) from None
        cpus, memory = rental_share(machine, len(uuids))
        ctx = SandboxContext(
            project=project,
            gpu_uuids=tuple(uuids),
            cpus=cpus,
            memory_bytes=memory,
            pids_limit=self.pids_limit,
            publish_address=self.publish_address,
        )
        problems = policy_violations(model, ctx)
        if problems:
            raise StackRejected(POLICY_PREFIX + "; ".join(problems))
        self.ledger.commit(job.rental_id, uuids)
        return harden(model, ctx), uuids

    def release(self, rental_id: str) -> list[str]:
        return self.ledger.release(rental_id)

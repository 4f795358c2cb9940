"""Telling the marketplace how a stack stands: its status and its containers.

Every part that learns something about a stack (a deploy or removal, a
container that stopped by itself, reconcile finding a status the marketplace
missed, a rental ending) reports through this one object. The agent's record
(the stacks table) is written before the report is queued, so the record is
never behind what the marketplace was told; the report itself goes through the
durable outbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost_agent.core import naming
from gpuhost_agent.core.gpu_ledger import GpuLedger
from gpuhost_agent.protocol import wire
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.outbox import CONTAINERS, STATUS, Outbox


@dataclass(frozen=True)
class StackRef:
    """Which stack a report is about, as the marketplace and Docker know it."""

    stack_id: str
    rental_id: str
    env_id: str
    project: str  # the Compose project: pStackName

    @classmethod
    def of_job(cls, job: wire.StackJob) -> StackRef:
        name = job.stack_name or (job.template or {}).get("name", "")
        return cls(job.stack_id, job.rental_id, job.env_id, naming.project_name(name, job.stack_id))


class StatusReporter:
    def __init__(self, outbox: Outbox, db: AgentDB, ledger: GpuLedger):
        self.outbox, self.db, self.ledger = outbox, db, ledger

    def status(self, stack: StackRef, status: str, error_msg: str = "", *, job_id: str) -> None:
        """`job_id` names the work the report belongs to: a marketplace job, or
        the agent's own (`reconcile-…`, `rental-clock-…`, `container-…`;
        docs/agent-api.yaml, StackStatusReport)."""
        body = {
            "status": status,
            "errorMsg": error_msg,
            "pStackName": stack.project,
            "pStackId": naming.provider_stack_id(stack.stack_id),
            "jobId": job_id,
            "reportedAt": wire.iso(),
        }
        gpus = self.ledger.assignments.get(stack.rental_id)
        if gpus:  # otherwise the marketplace keeps what it has
            body["assignedGPUs"] = list(gpus)
        if status == wire.REMOVED:
            self.db.forget_stack(stack.stack_id)
        else:
            self.db.stack_status(stack.stack_id, stack.rental_id, stack.env_id, stack.project, status, error_msg)
        self.outbox.put(STATUS, stack.stack_id, body)

    def refusal(self, stack_id: str, error_msg: str, *, job_id: str) -> None:
        """ERROR for a job the agent could not even decode: nothing else of the
        stack is known, and its record is left as it is."""
        self.outbox.put(
            STATUS, stack_id, {"status": wire.ERROR, "errorMsg": error_msg, "jobId": job_id, "reportedAt": wire.iso()}
        )

    def containers(self, stack_id: str, containers: list[dict]) -> None:
        """The stack's containers in the seed's shape (core/containers.py)."""
        self.outbox.put(CONTAINERS, stack_id, {"containers": containers, "observedAt": wire.iso()})

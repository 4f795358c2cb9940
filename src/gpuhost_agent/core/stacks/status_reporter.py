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

from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.stacks import naming
from gpuhost_agent.protocol import wire, wire_jobs, wire_time
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.outbox import CONTAINERS, STATUS, Outbox


@dataclass(frozen=True)
class StackRef:
    """Which stack a report is about, as the marketplace and Docker know it."""

    stack_id: str
    rental_id: str
    env_id: str
    project: str  # the Compose project: pStackName
    name: str = ""  # the marketplace's name for it, where the work came with one (a job)

    @classmethod
    def of_job(cls, job: wire_jobs.StackJob) -> StackRef:
        name = job.stack_name or (job.template or {}).get("name", "")
        return cls(job.stack_id, job.rental_id, job.env_id, naming.project_name(name, job.stack_id), name)


class StatusReporter:
    def __init__(self, outbox: Outbox, db: AgentDB, ledger: GpuLedger):
        self.outbox, self.db, self.ledger = outbox, db, ledger
        # For the status socket, dropped with the stack: the last list sent per
        # stack (what the marketplace opens tunnels from), and the names jobs
        # gave (the record keeps only the Compose project, a slug of it).
        self._containers: dict[str, list[wire.Container]] = {}
        self._names: dict[str, str] = {}

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
            "reportedAt": wire_time.iso(),
        }
        gpus = self.ledger.assignments.get(stack.rental_id)
        if gpus:  # otherwise the marketplace keeps what it has
            body["assignedGPUs"] = list(gpus)
        if status == wire.REMOVED:
            self.db.forget_stack(stack.stack_id)
            self._containers.pop(stack.stack_id, None)
            self._names.pop(stack.stack_id, None)
        else:
            if stack.name:
                self._names[stack.stack_id] = stack.name
            self.db.stack_status(stack.stack_id, stack.rental_id, stack.env_id, stack.project, status, error_msg)
        self.outbox.put(STATUS, stack.stack_id, body)

    def refusal(self, stack_id: str, error_msg: str, *, job_id: str) -> None:
        """ERROR for a job the agent could not even decode: nothing else of the
        stack is known, and its record is left as it is."""
        self.outbox.put(
            STATUS,
            stack_id,
            {"status": wire.ERROR, "errorMsg": error_msg, "jobId": job_id, "reportedAt": wire_time.iso()},
        )

    def containers(self, stack_id: str, containers: list[wire.Container]) -> None:
        """The stack's containers in the seed's shape (core/stacks/container_list.py)."""
        self._containers[stack_id] = containers
        self.outbox.put(CONTAINERS, stack_id, {"containers": containers, "observedAt": wire_time.iso()})

    def names(self) -> dict[str, str]:
        """The stacks' names as their jobs gave them since the agent started (read-only)."""
        return dict(self._names)

    def last_containers(self, stack_id: str) -> list[wire.Container] | None:
        """The stack's containers as last reported since the agent started, None
        when none was yet (the status socket's tunnels; read-only)."""
        return self._containers.get(stack_id)

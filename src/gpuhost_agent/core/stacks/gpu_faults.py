"""What a GPU fault means for the rentals (the event itself: inventory/gpu_events.py).

The GPU is out of service at once: never handed out again, reported in the
next heartbeat (`gpuAssignments.outOfService`, sent out of turn), and the
rental that holds it hears it on each of its APPLIED stacks, in `errorMsg`
(`out of service: GPU GPU-..., Xid 79 (the GPU has fallen off the bus)`).
That part of the errorMsg stays when later reports name or clear stopped
containers (core/sandbox/apply.py, kept_notes). The rental keeps its GPU: its
containers still run there, and what to do is the renter's and the host's.
Out of service lasts until the agent restarts; a GPU that is really broken
then fails the probe (NVML error or uncorrected ECC errors) and stays out.
"""

from __future__ import annotations

import uuid as uuidlib

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.sandbox.apply import GPU_FAULT_PREFIX, kept_notes
from gpuhost_agent.core.stacks.status_reporter import StackRef, StatusReporter
from gpuhost_agent.inventory.gpu_events import GpuFault
from gpuhost_agent.protocol import wire
from gpuhost_agent.storage.agent_db import AgentDB

log = get_logger(__name__)


def fault_note(fault: GpuFault) -> str:
    return f"{GPU_FAULT_PREFIX}{fault.uuid}, {fault.reason}"


def with_fault(error_msg: str, note: str) -> str:
    """The stack's errorMsg with the note added before what stays (other
    faults, the sandbox's changes), after a containers' part if any."""
    kept = kept_notes(error_msg)
    own = error_msg[: len(error_msg) - len(kept)].rstrip("; ")
    return "; ".join(part for part in (own, note, kept) if part)


class GpuFaults:
    def __init__(self, ledger: GpuLedger, db: AgentDB, reporter: StatusReporter):
        self.ledger, self.db, self.reporter = ledger, db, reporter

    def fault(self, fault: GpuFault) -> None:
        if not self.ledger.mark_out_of_service(fault.uuid, fault.reason):
            return
        rental_id = self.ledger.holder(fault.uuid)
        log.error(
            "gpu_out_of_service",
            gpu=fault.uuid,
            reason=fault.reason,
            rental_id=rental_id,
            hint="it is handed to no new rental; check the GPU (nvidia-smi -q, dmesg) and restart the agent once fixed",
        )
        if rental_id is None:
            return
        note = fault_note(fault)
        for stack_id, record in sorted(self.db.stacks().items()):
            if record["rental_id"] != rental_id or record.get("status") != wire.APPLIED:
                continue
            stack = StackRef(stack_id, rental_id, record["env_id"], record["project"])
            error = with_fault(record.get("error_msg") or "", note)
            self.reporter.status(stack, wire.APPLIED, error, job_id=f"gpu-{uuidlib.uuid4().hex[:12]}")

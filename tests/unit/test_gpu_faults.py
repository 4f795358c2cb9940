"""GPU faults, the decisions: which NVML events take a GPU out of service,
how the note joins a stack's errorMsg and stays there, and what the ledger
then hands out. (From the stand-in NVML's events to the renter:
tests/integration/test_gpu_faults_engine.py.)"""

from __future__ import annotations

from gpuhost_agent.core.containers.events import error_to_report
from gpuhost_agent.core.gpus.allocation import GpuSlot
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.sandbox.apply import notices_message
from gpuhost_agent.core.stacks.gpu_faults import fault_note, with_fault
from gpuhost_agent.inventory.gpu_events import DOUBLE_BIT_ECC, UNAVAILABLE, XID, GpuFault, fault_of
from gpuhost_agent.protocol import wire
from gpuhost_agent.storage.agent_db import AgentDB


def test_which_events_take_a_gpu_out_of_service() -> None:
    assert fault_of(XID, 79) == "Xid 79 (the GPU has fallen off the bus)"
    assert fault_of(XID, 48) == "Xid 48 (double-bit ECC error)"
    assert fault_of(XID, 13) is None and fault_of(XID, 31) is None  # a workload's own errors
    assert fault_of(DOUBLE_BIT_ECC, 0) == "uncorrectable (double-bit) ECC memory error"
    assert fault_of(UNAVAILABLE, 0) == "the GPU became unavailable"
    assert fault_of(0x4, 0) is None  # a P-state change


def test_the_note_joins_the_error_and_stays_through_container_reports() -> None:
    note = fault_note(GpuFault("GPU-1", "Xid 79 (the GPU has fallen off the bus)"))
    changes = notices_message(['service "web": ipc host became private IPC with shm_size 2.0 GiB'])
    assert with_fault("", note) == note
    assert with_fault(changes, note) == f"{note}; {changes}"
    stopped = f"container web exited with code 1; {changes}"
    assert with_fault(stopped, note) == f"container web exited with code 1; {note}; {changes}"
    record = {"status": wire.APPLIED, "error_msg": f"{note}; {changes}"}
    assert error_to_report(record, "", may_set=False) is None  # all running again: nothing to clear
    assert error_to_report(record, "container web exited with code 3") == (
        f"container web exited with code 3; {note}; {changes}"
    )


def test_a_gpu_out_of_service_is_handed_to_no_one(tmp_path) -> None:
    ledger = GpuLedger(AgentDB(tmp_path / "agent.db"))
    slots = [GpuSlot("G0"), GpuSlot("G1")]
    ledger.commit("r1", ["G0"])
    assert ledger.mark_out_of_service("G0", "Xid 79") and not ledger.mark_out_of_service("G0", "again")
    assert ledger.holder("G0") == "r1" and ledger.holder("G1") is None
    assert ledger.states(slots)["assigned"] == {"r1": ["G0"]}  # the rental keeps it
    ledger.release("r1")
    assert ledger.states(slots)["outOfService"] == ["G0"] and ledger.states(slots)["free"] == ["G1"]
    assert ledger.plan(slots, "r2", 1) == ["G1"]
    assert not ledger.fits_after_release(slots, "r3", 2)

"""A GPU fault: an Xid event from NVML (the stand-in library's
event file) takes the GPU out of service at once: the rental using it hears
it in its stack's errorMsg, the heartbeat says it, and no rental gets it
again. A workload's own Xid (13) changes nothing."""

from __future__ import annotations

import asyncio

from support.waiting import until

from gpuhost_agent.protocol import wire

SLEEPER = (
    "services:\n  app:\n    image: gpuhost-test/busybox:1\n    command: ['sleep', '3600']\n    stop_signal: SIGKILL\n"
)


def _append(path, line: str) -> None:
    with open(path, "a") as events:
        events.write(line + "\n")


async def test_an_xid_takes_the_gpu_out_of_service_and_tells_its_rental(gpu_agent, monkeypatch, tmp_path):
    events = tmp_path / "nvml.events"
    await asyncio.to_thread(events.write_text, "")
    monkeypatch.setenv("FAKE_NVML_EVENTS", str(events))
    renter, parts, _local, _ = await gpu_agent(gpus=2)
    rental_id = await renter.rental(gpu_count=1)
    stack_id = await renter.stack(rental_id, SLEEPER)
    await renter.wait_stack(rental_id, stack_id, (wire.APPLIED,), timeout=30)
    (faulty,) = parts.deployer.sandbox.ledger.assignments[rental_id]
    gpus = (await parts.host.machine_facts())["nvml"]["gpus"]
    index = next(gpu["index"] for gpu in gpus if gpu["uuid"] == faulty)

    await asyncio.to_thread(_append, events, f"{index} 8 13")  # the workload's own illegal access: not the GPU's fault
    await asyncio.to_thread(_append, events, f"{index} 8 79")
    note = f"out of service: GPU {faulty}, Xid 79 (the GPU has fallen off the bus)"
    await until(lambda: note in renter.store.stacks[stack_id]["errorMsg"], timeout=10)
    assert renter.store.stacks[stack_id]["status"] == wire.APPLIED
    assert list(parts.deployer.sandbox.ledger.out_of_service) == [faulty]  # Xid 13 did not count
    await until(lambda: (renter.store.live.get("gpuAssignments") or {}).get("assigned", {}).get(rental_id), timeout=5)

    # The container watch's later reports keep the note (a resync finds every container running).
    await parts.agent.resync_containers()
    await asyncio.sleep(0.5)
    assert note in renter.store.stacks[stack_id]["errorMsg"]

    # Once the rental ends, the GPU is not offered again: 1 of 2 is available, and a 1-GPU rental gets the other.
    status, _ = await renter.call("DELETE", f"/rentals/{rental_id}")
    assert status == 200
    await until(lambda: rental_id not in parts.deployer.sandbox.ledger.assignments, timeout=30)
    await until(lambda: faulty in (renter.store.live.get("gpuAssignments") or {}).get("outOfService", []), timeout=5)
    status, listing = await renter.call("GET", f"/environments/{renter.store.envId}/listing")
    assert listing["availableGPUs"] == 1
    second = await renter.rental(gpu_count=1)
    stack_id = await renter.stack(second, SLEEPER)
    await renter.wait_stack(second, stack_id, (wire.APPLIED,), timeout=30)
    assert parts.deployer.sandbox.ledger.assignments[second] != [faulty]

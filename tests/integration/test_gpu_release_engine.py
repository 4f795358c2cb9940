"""GPUs free when the listing says so, as a new user meets it: end a
rental, create another at once and deploy. The ended rental's containers take
their stop timeout to go; the new deploy waits for its GPUs (APPLYING, with
the reason) instead of failing with "0 of 4 GPUs are free", and the listing
follows the agent's own account of its GPUs (the heartbeat's gpuAssignments)."""

from __future__ import annotations

import asyncio

from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import wire

# Ignores SIGTERM: it goes only when the stop timeout (6 s here) is over.
STUBBORN = f"""
services:
  app:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "trap '' TERM; while true; do sleep 0.2; done"]
"""
SLEEPER = f"""
services:
  app:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
    stop_signal: SIGKILL
"""


def _statuses(store, stack_ids: set[str]) -> list[dict]:
    """Every status report the marketplace takes for these stacks, from now on."""
    seen: list[dict] = []
    apply_status = store.apply_status

    def status(target, report):
        if target in stack_ids:
            seen.append(dict(report))
        return apply_status(target, report)

    store.apply_status = status
    return seen


async def _listing(renter) -> dict:
    status, body = await renter.call("GET", f"/environments/{renter.store.envId}/listing")
    assert status == 200
    return body


async def test_a_rental_created_as_another_ends_gets_its_gpus(gpu_agent):
    renter, parts, _local, _ = await gpu_agent(gpus=4, stop_timeout=6)
    ending, staying = await renter.rental(gpu_count=2), await renter.rental(gpu_count=2)
    for rental_id, content in ((ending, STUBBORN), (staying, SLEEPER)):
        stack_id = await renter.stack(rental_id, content)
        assert (await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=30))["status"] == (
            wire.APPLIED
        )
    await until(lambda: (renter.store.live.get("gpuAssignments") or {}).get("free") == [], timeout=10)
    assert (await _listing(renter))["availableGPUs"] == 0

    status, _ = await renter.call("DELETE", f"/rentals/{ending}")
    assert status == 200
    await until(lambda: ending in (renter.store.live.get("gpuAssignments") or {}).get("releasing", {}), timeout=5)
    assert (await _listing(renter))["availableGPUs"] == 2  # being released: offered already

    new = await renter.rental(gpu_count=2)
    assert (await _listing(renter))["availableGPUs"] == 0
    stack_id = await renter.stack(new, SLEEPER)
    reports = _statuses(renter.store, {stack_id})
    stack = await renter.wait_stack(new, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    waited = [r for r in reports if r["status"] == wire.APPLYING and "ended rental is releasing" in r["errorMsg"]]
    assert waited, reports  # it did wait, and said why
    assert stack["errorMsg"] == ""
    ledger = parts.deployer.sandbox.ledger
    assert ending not in ledger.assignments and len(ledger.assignments[new]) == 2
    assert set(ledger.assignments[new]).isdisjoint(ledger.assignments[staying])


async def test_a_rental_no_release_can_serve_is_refused_at_once(gpu_agent):
    """The marketplace refuses a gpuCount the environment cannot serve."""
    renter, _parts, _local, _ = await gpu_agent(gpus=2)
    await until(lambda: (renter.store.host.get("report") or {}).get("listing"), timeout=20)
    holder = await renter.rental(gpu_count=2)
    stack_id = await renter.stack(holder, SLEEPER)
    await renter.wait_stack(holder, stack_id, (wire.APPLIED,), timeout=30)
    for count, status_wanted in ((1, 409), (10**17, 400)):
        status, body = await renter.call(
            "POST", "/rentals", {"envId": renter.store.envId, "gpuCount": count, "name": "late"}
        )
        assert status == status_wanted, body
    assert (
        "0 of its 2 GPU(s) are available"
        in (await renter.call("POST", "/rentals", {"envId": renter.store.envId, "gpuCount": 1}))[1]["message"]
    )


async def test_a_stack_removed_while_it_waits_for_released_gpus_goes_at_once(gpu_agent):
    """The renter deletes a stack that waits for GPUs an ended rental's stubborn
    container holds for 10 s: the removal does not wait for them (core/stacks/deploy_cancels.py)."""
    renter, parts, _local, _ = await gpu_agent(gpus=2, stop_timeout=10)
    ending = await renter.rental(gpu_count=2)
    stubborn = await renter.stack(ending, STUBBORN)
    assert (await renter.wait_stack(ending, stubborn, (wire.APPLIED, wire.ERROR), timeout=30))["status"] == (
        wire.APPLIED
    )
    status, _ = await renter.call("DELETE", f"/rentals/{ending}")
    assert status == 200
    await until(lambda: ending in (renter.store.live.get("gpuAssignments") or {}).get("releasing", {}), timeout=5)
    new = await renter.rental(gpu_count=2)
    stack_id = await renter.stack(new, SLEEPER)
    reports = _statuses(renter.store, {stack_id})
    await until(lambda: any("ended rental is releasing" in (r.get("errorMsg") or "") for r in reports), timeout=10)
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, _ = await renter.call("DELETE", f"/rentals/{new}/stacks/{stack_id}")
    assert status in (200, 202)
    assert await renter.wait_stack(new, stack_id, (), timeout=30) is None
    assert loop.time() - started < 6  # the ended rental's container still holds the GPUs
    assert ending in (renter.store.live.get("gpuAssignments") or {}).get("releasing", {})
    (deploy,) = [job for job in renter.store.jobs.values() if job.stackId == stack_id and job.type == wire.JOB_DEPLOY]
    assert deploy.errorMsg == "deploy stopped: the stack's removal came before the deploy finished"
    assert new not in parts.deployer.sandbox.ledger.assignments

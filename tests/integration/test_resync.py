"""The periodic container resync: reports changes Docker made behind the agent's
back, and only for this environment's containers."""

from __future__ import annotations

import asyncio

from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import wire


async def test_resync_reports_changes_for_this_environment_only(local_market, docker_client):
    renter, parts, _local = local_market
    rental_id, stack_id, _job = await renter.deployed()
    foreign = await asyncio.to_thread(
        docker_client.containers.create,
        TEST_IMAGE,
        ["sleep", "3600"],
        labels={wire.LABEL_MANAGED: "true", wire.LABEL_ENV: "another-environment", wire.LABEL_STACK: "foreign-stack"},
    )
    try:
        (container,) = await asyncio.to_thread(
            docker_client.containers.list, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}
        )
        parts.agent.container_watch.stop()  # the resync alone: as when an event was missed
        await asyncio.to_thread(container.stop, timeout=1)
        await asyncio.to_thread(container.reload)
        await parts.agent.resync_containers()
        await until(lambda: parts.outbox.pending() == 0)
        listed = await renter.containers(rental_id, stack_id)
        assert [c["State"] for c in listed] == [f"exited ({container.attrs['State']['ExitCode']})"]
        assert parts.outbox.rejected == 0, "a foreign environment's container was reported"
        assert "foreign-stack" not in renter.store.containers
    finally:
        await asyncio.to_thread(foreign.remove, force=True)

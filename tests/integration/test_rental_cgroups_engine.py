"""One cgroup per rental, on the real engine and this machine's
cgroup v1 tree: every container of a rental sits in it, the rental's memory,
CPU and process limits hold for all of its containers together, and the
cgroup goes with the rental. (The layout alone, v1 and v2, on a folder:
tests/unit/test_rental_cgroups.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.rental_cgroups import SYSFS

PIDS = 64  # the rental's processes, all containers together (and each container's own limit)
# Three services that each try to hold 26 processes: 78 in all, more than the rental's 64 (two of
# them stay well under it, so that the third can always start; its own forks are what is refused).
# The forks are a child shell's, which may die of a refused fork; the container's sleep stays.
FORKERS = f"""
services:
{
    "".join(
        f'''  forker{n}:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "sh -c 'for i in $$(seq 25); do sleep 3600 & done' & exec sleep 3600"]
'''
        for n in range(3)
    )
}
"""

SLEEPER_ONE = f"services:\n  probe:\n    image: {TEST_IMAGE}\n    command: ['sleep', '3600']\n"

pytestmark = pytest.mark.skipif(
    not (SYSFS / "memory").is_dir(), reason="these checks read a cgroup v1 tree (this machine's)"
)


def _read(path: Path) -> str:
    return path.read_text().strip()


async def test_a_rentals_containers_share_one_cgroup_and_its_limits(gpu_agent, docker_client):
    renter, parts, _local, _ = await gpu_agent(gpus=8, pids_limit=PIDS)
    rental_id = await renter.rental(gpu_count=2)
    stack_id = await renter.stack(rental_id, FORKERS)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]

    parent = f"/gpuhost-agent/r-{rental_id}"
    containers = await asyncio.to_thread(
        docker_client.containers.list, filters={"label": f"{wire.LABEL_RENTAL}={rental_id}"}
    )
    assert len(containers) == 3
    assert {c.attrs["HostConfig"]["CgroupParent"] for c in containers} == {parent}

    memory = int(containers[0].attrs["HostConfig"]["Memory"])
    cpus = containers[0].attrs["HostConfig"]["NanoCpus"] / 1e9
    folder = parent.lstrip("/")
    assert int(await asyncio.to_thread(_read, SYSFS / "memory" / folder / "memory.limit_in_bytes")) == memory
    quota = int(await asyncio.to_thread(_read, SYSFS / "cpu" / folder / "cpu.cfs_quota_us"))
    assert quota == int(cpus * 100_000)
    assert await asyncio.to_thread(_read, SYSFS / "pids" / folder / "pids.max") == str(PIDS)

    # Each container may hold 64 processes on its own; together they stop at the rental's 64.
    pids = SYSFS / "pids" / folder / "pids.current"
    await until(lambda: asyncio.to_thread(lambda: int(_read(pids)) >= PIDS - 2), timeout=20)
    await asyncio.sleep(1)
    assert int(await asyncio.to_thread(_read, pids)) <= PIDS
    refused = await asyncio.to_thread(_refused_forks, SYSFS / "pids" / folder)
    assert refused > 0  # 78 processes asked for, the rental's limit said no to some

    status, _ = await renter.call("DELETE", f"/rentals/{rental_id}")
    assert status == 200
    await until(lambda: rental_id not in parts.deployer.sandbox.ledger.assignments, timeout=60)
    leftovers = await asyncio.to_thread(lambda: [p for p in SYSFS.glob(f"*/{folder}")])
    assert leftovers == []


def _refused_forks(folder: Path) -> int:
    """Forks refused for the pids limit, counted where they were tried (the containers' cgroups)."""
    return sum(int(_read(events).split()[-1]) for events in [folder / "pids.events", *folder.glob("*/pids.events")])


async def test_reconcile_writes_a_rentals_limits_again(gpu_agent):
    """After a reboot dockerd restarts the containers into their rental's cgroup,
    made again by runc without limits: the agent's next reconcile restores them."""
    renter, parts, _local, _ = await gpu_agent(gpus=8, pids_limit=PIDS)
    rental_id = await renter.rental(gpu_count=2)
    stack_id = await renter.stack(rental_id, FORKERS.split("  forker1:")[0])
    assert (await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60))["status"] == (
        wire.APPLIED
    )
    pids = SYSFS / "pids" / f"gpuhost-agent/r-{rental_id}" / "pids.max"
    await asyncio.to_thread(pids.write_text, "max\n")  # as runc leaves it
    await parts.reconciler.run_once()
    assert await asyncio.to_thread(_read, pids) == str(PIDS)


def _filler(size_bytes: int) -> str:
    """Four services whose main process (tail, reading `size_bytes` from a
    FIFO) holds that much memory in its buffer, once the stack is APPLIED,
    and then waits on a pipe nobody reads: no CPU spent while it holds it.
    Anonymous memory, so the kernel must kill at the limit (page cache or
    tmpfs would only get ENOMEM)."""
    script = (
        "mkfifo /w/in /w/out; exec 3<>/w/out; sleep 8; "
        f"head -c {size_bytes} /dev/zero > /w/in & exec tail -c {size_bytes} /w/in >&3"
    )
    return "services:\n" + "".join(
        f"""  filler{n}:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "{script}"]
    tmpfs: ["/w"]
"""
        for n in range(4)
    )


async def test_a_rental_over_its_memory_is_oom_killed_and_told_so(gpu_agent, docker_client):
    """Services each under their own memory limit, together over the
    rental's: the kernel kills in the rental's cgroup, and the stack's
    errorMsg says the rental's limit was reached (Docker's OOMKilled looks at
    the container's own cgroup and does not say it)."""
    renter, _parts, _local, _ = await gpu_agent(gpus=64)  # a small share: 1 GPU of 64 on this machine
    rental_id = await renter.rental(gpu_count=1)
    probe = await renter.stack(rental_id, SLEEPER_ONE)
    assert (await renter.wait_stack(rental_id, probe, (wire.APPLIED, wire.ERROR), timeout=60))["status"] == wire.APPLIED
    (box,) = await asyncio.to_thread(
        docker_client.containers.list, filters={"label": f"{wire.LABEL_RENTAL}={rental_id}"}
    )
    memory = int(box.attrs["HostConfig"]["Memory"])  # each container's limit, and the rental's together
    # busybox tail's buffer may reach twice what it holds: each alone stays under its own limit, four do not
    stack_id = await renter.stack(rental_id, _filler(int(memory * 0.3)))

    def told() -> bool:
        stack = renter.store.stacks.get(stack_id) or {}
        return "the rental's memory limit, shared by all its containers, was reached" in stack.get("errorMsg", "")

    try:
        await until(told, timeout=90)
    except AssertionError:
        control = SYSFS / "memory" / f"gpuhost-agent/r-{rental_id}" / "memory.oom_control"
        usage = SYSFS / "memory" / f"gpuhost-agent/r-{rental_id}" / "memory.max_usage_in_bytes"
        boxes = await asyncio.to_thread(
            docker_client.containers.list, all=True, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}
        )
        raise AssertionError(
            (
                renter.store.stacks.get(stack_id),
                memory,
                await asyncio.to_thread(_read, control),
                await asyncio.to_thread(_read, usage),
                [(b.name, b.attrs["State"]) for b in boxes],
            )
        ) from None

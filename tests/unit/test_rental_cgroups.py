"""The rental's cgroup, laid out on a folder standing in for /sys/fs/cgroup:
cgroup v1 (a directory per controller) and v2 (one tree), which driver gets
one, and what is refused. (On this machine's real tree, with dockerd:
tests/integration/test_rental_cgroups_engine.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.settings import sandbox_for, stack_context

from gpuhost_agent.core.sandbox.harden import harden
from gpuhost_agent.runtime.rental_cgroups import CgroupError, RentalCgroups, RentalLimits
from gpuhost_agent.runtime.rental_slices import RentalSlices

LIMITS = RentalLimits(memory_bytes=2 * 1024**3, cpus=1.5, pids=512)


def v1_tree(root: Path) -> Path:
    for controller in ("memory", "cpu", "pids", "cpuset", "systemd"):
        (root / controller).mkdir(parents=True)
    return root


def test_v1_writes_each_controllers_limit_and_removes_every_hierarchys_folder(tmp_path) -> None:
    cgroups = RentalCgroups(v1_tree(tmp_path))
    assert cgroups.configure("cgroupfs", "1") is None
    assert cgroups.parent_of("r1") == "/gpuhost-agent/r-r1"
    cgroups.apply("r1", LIMITS)
    folder = "gpuhost-agent/r-r1"
    assert (tmp_path / "memory" / folder / "memory.limit_in_bytes").read_text() == f"{2 * 1024**3}\n"
    assert (tmp_path / "cpu" / folder / "cpu.cfs_quota_us").read_text() == "150000\n"
    assert (tmp_path / "cpu" / folder / "cpu.cfs_period_us").read_text() == "100000\n"
    assert (tmp_path / "pids" / folder / "pids.max").read_text() == "512\n"
    (tmp_path / "cpuset" / folder).mkdir(parents=True)  # runc makes it in every hierarchy
    mark = tmp_path / "memory" / folder / "memory.max_usage_in_bytes"
    mark.write_text(f"{1024**3}\n")
    assert not cgroups.memory_limit_reached("r1")  # half of its 2 GiB at most
    mark.write_text(f"{2 * 1024**3}\n")
    assert cgroups.memory_limit_reached("r1")
    assert mark.read_text() == "0\n"  # the mark starts again (the kernel takes it as "from now")
    for written in (tmp_path / "memory" / folder).iterdir():  # the kernel's files are not files to rmdir
        written.unlink()
    for written in [*(tmp_path / "cpu" / folder).iterdir(), *(tmp_path / "pids" / folder).iterdir()]:
        written.unlink()
    assert cgroups.remove("r1")
    assert not list(tmp_path.glob(f"*/{folder}"))


def test_v2_enables_the_controllers_down_to_the_rental(tmp_path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    cgroups = RentalCgroups(tmp_path)
    assert cgroups.configure("cgroupfs", "2") is None
    cgroups.apply("r2", LIMITS)
    folder = tmp_path / "gpuhost-agent" / "r-r2"
    assert (folder / "memory.max").read_text() == f"{2 * 1024**3}\n"
    assert (folder / "cpu.max").read_text() == "150000 100000\n"
    assert (folder / "pids.max").read_text() == "512\n"
    for holder in (tmp_path, tmp_path / "gpuhost-agent", folder):
        assert (holder / "cgroup.subtree_control").read_text() == "+memory +cpu +pids\n"
    (folder / "memory.events.local").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 0\n")
    assert cgroups.memory_limit_reached("r2")
    assert not cgroups.memory_limit_reached("r2")  # not again since


@pytest.mark.parametrize("driver", ["systemd", "kubelet"])
def test_without_a_driver_the_agent_can_serve_the_reason_is_said(tmp_path, driver: str) -> None:
    """systemd here is the driver with systemd not running (this machine); the
    driver with systemd running is tests/unit/test_rental_slices.py."""
    cgroups = RentalCgroups(v1_tree(tmp_path), RentalSlices(systemd_running=tmp_path / "no-systemd"))
    reason = cgroups.configure(driver, "2")
    assert reason and f"{driver} cgroup driver" in reason and "each container still has the rental's limits" in reason
    assert cgroups.parent_of("r1") is None
    cgroups.apply("r1", LIMITS)  # nothing to do
    assert not list(tmp_path.glob("*/gpuhost-agent"))
    assert "not mounted" in (RentalCgroups(tmp_path / "none").configure("cgroupfs", "2") or "")


def test_a_rental_id_that_cannot_name_a_folder_is_refused(tmp_path) -> None:
    cgroups = RentalCgroups(v1_tree(tmp_path))
    cgroups.configure("cgroupfs", "1")
    for bad in ("../../etc", "a/b", "", "x" * 200, "r1\n"):  # match took the trailing newline
        with pytest.raises(CgroupError):
            cgroups.parent_of(bad)


def test_every_service_of_the_rental_gets_its_cgroup_as_parent() -> None:
    model = {"services": {"a": {"image": "x"}, "b": {"image": "y"}}}
    ctx = stack_context(project="p", cgroup_parent="/gpuhost-agent/r-r1")
    assert {s["cgroup_parent"] for s in harden(model, ctx)["services"].values()} == {"/gpuhost-agent/r-r1"}
    assert all("cgroup_parent" not in s for s in harden(model, stack_context(project="p"))["services"].values())


async def test_deploys_at_the_same_moment_all_get_their_rentals_cgroup(tmp_path) -> None:
    """Found end to end: the first deploy configured the cgroups while a second
    one, at the same moment, went on with none (its container had no parent)."""
    import asyncio

    from gpuhost_agent.core.gpus.ledger import GpuLedger
    from gpuhost_agent.core.rentals.shares import CgroupShares
    from gpuhost_agent.storage.agent_db import AgentDB

    async def no_facts() -> dict:
        return {}

    ledger = await asyncio.to_thread(lambda: GpuLedger(AgentDB(tmp_path / "a.db")))
    shares = CgroupShares(RentalCgroups(await asyncio.to_thread(v1_tree, tmp_path / "cg")))
    sandbox = sandbox_for(ledger, no_facts, shares=shares)
    docker = {"cgroupDriver": "cgroupfs", "cgroupVersion": "1"}
    parents = await asyncio.gather(*(sandbox.shares.parent(docker, f"r{n}") for n in range(5)))
    assert parents == [f"/gpuhost-agent/r-r{n}" for n in range(5)]


def test_probe_tells_the_operator_whether_rentals_share_their_limits() -> None:
    """Before any renter deploys: the probe's fact and doctor's line say it."""
    from gpuhost_agent.inventory.host_probe import rental_limits
    from gpuhost_agent.inventory.render import _rental_limits

    other = rental_limits("kubelet", "2")
    assert other["perRental"] is False and "kubelet cgroup driver" in other["detail"]
    assert _rental_limits(other).startswith("per container only: dockerd uses the kubelet cgroup driver")
    shared = {"perRental": True, "detail": "a cgroup per rental (cgroupfs, cgroup v1)"}
    assert _rental_limits(shared) == "shared by its containers: a cgroup per rental (cgroupfs, cgroup v1)"

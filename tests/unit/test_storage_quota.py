"""A real disk quota per container only where Docker's disk has one: overlay2
on XFS mounted with project quotas, or the btrfs driver. The `docker info` shapes are the
engine's own (this machine's is the first); the mount tables are lines as
the kernel writes /proc/self/mountinfo."""

from __future__ import annotations

import asyncio

import pytest
from support.machine_samples import good_host
from support.settings import sandbox_for

from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.rentals.disk_share import disk_share
from gpuhost_agent.core.sandbox.apply import review_raw
from gpuhost_agent.core.sandbox.context import StackSite
from gpuhost_agent.inventory.storage_quota import mount_of, storage_quota
from gpuhost_agent.protocol import wire, wire_jobs
from gpuhost_agent.storage.agent_db import AgentDB

EXT4 = {
    "Driver": "overlay2",
    "DockerRootDir": "/var/lib/docker",
    "DriverStatus": [["Backing Filesystem", "extfs"], ["Supports d_type", "true"], ["Native Overlay Diff", "true"]],
}
XFS = {**EXT4, "DriverStatus": [["Backing Filesystem", "xfs"], ["Supports d_type", "true"]]}
ROOT = "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro\n"
DATA_PQUOTA = "95 22 259:3 / /var/lib/docker rw,relatime shared:40 - xfs /dev/nvme1n1 rw,attr2,inode64,prjquota\n"
DATA_PLAIN = "95 22 259:3 / /var/lib/docker rw,relatime shared:40 - xfs /dev/nvme1n1 rw,attr2,inode64,noquota\n"


def test_only_overlay2_on_xfs_with_project_quotas_has_one() -> None:
    assert storage_quota(XFS, ROOT + DATA_PQUOTA) == {
        "available": True,
        "detail": "overlay2 on XFS with project quotas at /var/lib/docker",
    }
    plain = storage_quota(XFS, ROOT + DATA_PLAIN)
    assert not plain["available"] and "/var/lib/docker is mounted without pquota" in plain["detail"]
    ext4 = storage_quota(EXT4, ROOT)
    assert not ext4["available"] and "overlay2 on extfs" in ext4["detail"]
    other = storage_quota({**EXT4, "Driver": "vfs"}, ROOT)
    assert not other["available"] and "vfs storage driver" in other["detail"]


def test_the_btrfs_driver_has_one_its_quota_groups() -> None:
    """dockerd's btrfs driver runs only on btrfs and caps a container's
    subvolume with a qgroup (test_modern_host writes past one)."""
    btrfs = {"Driver": "btrfs", "DockerRootDir": "/var/lib/docker", "DriverStatus": [["Btrfs", ""]]}
    data = "95 22 0:40 / /var/lib/docker rw,relatime shared:40 - btrfs /dev/loop0 rw,space_cache=v2,subvol=/\n"
    assert storage_quota(btrfs, ROOT + data) == {
        "available": True,
        "detail": "btrfs with quota groups at /var/lib/docker",
    }


def test_the_mount_is_the_longest_mount_point_above_the_data_root() -> None:
    table = ROOT + DATA_PQUOTA + "96 22 0:50 / /var/lib/dockerfoo rw - tmpfs tmpfs rw\n"
    assert mount_of("/var/lib/docker", table)[0] == "/var/lib/docker"
    assert "prjquota" in mount_of("/var/lib/docker/overlay2", table)[1]
    assert mount_of("/var/lib/dockerx", table)[0] == "/"


@pytest.mark.parametrize("quota", [True, False])
async def test_each_container_gets_the_rentals_disk_share_as_its_size_only_with_a_quota(tmp_path, quota) -> None:
    facts = good_host()
    facts["host"]["docker"]["storageQuota"] = {"available": quota, "detail": "..."}
    facts["host"]["storage"] = {"path": "/var/lib/docker", "totalBytes": 1000 * 1024**3, "freeBytes": 900 * 1024**3}

    async def machine() -> dict:
        return facts

    ledger = GpuLedger(await asyncio.to_thread(AgentDB, tmp_path / "agent.db"))
    sandbox = sandbox_for(ledger, machine, disk_floor_bytes=20 * 1024**3)
    text = "services:\n  a:\n    image: busybox\n  b:\n    image: busybox\n"
    job = wire_jobs.StackJob(
        "job-1", wire.JOB_DEPLOY, "stack-1", "rental-1", "env-1", "s", {"content": text}, gpu_count=1
    )
    model = {"name": "p", "services": {"a": {"image": "busybox"}, "b": {"image": "busybox"}}}
    hardened, uuids, _ = await sandbox.apply(job, model, review_raw(text), StackSite(project="p"))
    sizes = {service.get("storage_opt", {}).get("size") for service in hardened["services"].values()}
    share = disk_share(1000 * 1024**3, 20 * 1024**3, 1, len(facts["nvml"]["gpus"]), None)
    assert sizes == ({str(share)} if quota else {None}) and len(uuids) == 1

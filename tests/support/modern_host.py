"""A modern GPU host, real all the way down, booted on the test engine for
tests/integration/test_modern_host.py.

The host is Debian 13 (scripts/rootfs-debian13.sh, cached in
tests/.rootfs/debian13), imported once as an image and booted with systemd 257
as PID 1 in a container: Debian's docker.io 26 started by systemd with
`native.cgroupdriver=systemd`, its Compose v2 plugin, /var/lib/docker on a
btrfs file system in a loop file this module makes, with dockerd's btrfs
storage driver (its `storage_opt: size` is a btrfs quota group: the kernel
caps each container's disk; XFS project quotas cannot be had with this
machine's kernel, docs/hosts.md), and
stand-in GPUs as the rest of the suite has them (the stand-in NVML library,
nvidia-smi, nvidia-ctk and the runtime hook). The agent gets there as a host
gets it: the marketplace's install line, pip finding the Debian 13 wheelhouse
(scripts/rootfs-wheelhouse-debian13.sh) through /etc/pip.conf.

Why not `--privileged`: this machine's capability bounding set lacks
CAP_SYS_RESOURCE, and runc asks for every capability for a privileged
container ("unable to apply caps: operation not permitted"). So the container
gets every capability but that one, no seccomp or AppArmor profile, a
writable /proc/sys (systempaths=unconfined), a cgroup namespace of its own
whose v1 hierarchies the boot script mounts again, writable (Docker mounts
them read-only for an unprivileged container), and the loop device.

This machine's kernel is cgroup v1, so the host is too, and systemd 257 boots
on v1 only when told SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1 (its command line:
a container's systemd reads its own, not the kernel's).

Network safety: the host sits on a bridge network of its own; the test's
marketplace listens on that network's gateway address (this machine), the
inner dockerd's proxy is the discard port (as the test engine's), and its
images come from the test engine by `docker save | docker load`. Nothing
reaches past this machine.

Needs root (loop devices, the engine).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import install_chroot
from support.fake_nvml import build_lib, h100_sxm, write_config
from support.stacks import TEST_IMAGE

ROOT = Path(__file__).resolve().parents[2]
ROOTFS = ROOT / "tests" / ".rootfs" / "debian13"
WHEELS = ROOT / "tests" / ".rootfs" / "wheels-debian13"
IMAGE = "gpuhost-test/debian13"
TEST_LABEL = "io.gpuhost.test=modern-host"
DISK_BYTES = 64 << 30  # sparse: only what the host writes takes room; doctor asks for 50 GiB free
GPUS = 64  # a 1-GPU rental is 1/64 of the machine: small enough to fill its memory in a test
BOOT_SECONDS = 90

# The boot script, PID 1 until it execs systemd: the cgroup hierarchies as this
# cgroup namespace sees them and writable, Docker's disk on btrfs, dockerd's
# settings, the stand-ins and pip's wheelhouse, then systemd.
BOOT = r"""set -e
mount -t tmpfs -o rw,nosuid,nodev,noexec,mode=755 cgroup /sys/fs/cgroup
for h in blkio cpu cpuacct cpuset devices freezer memory pids; do
    mkdir -p /sys/fs/cgroup/$h
    mount -t cgroup -o rw,nosuid,nodev,noexec,$h cgroup /sys/fs/cgroup/$h
done
mkdir -p /sys/fs/cgroup/systemd /sys/fs/cgroup/unified
mount -t cgroup -o rw,nosuid,nodev,noexec,none,name=systemd cgroup /sys/fs/cgroup/systemd
mount -t cgroup2 -o rw,nosuid,nodev,noexec cgroup2 /sys/fs/cgroup/unified
mkdir -p /var/lib/docker /etc/docker
[ "$(blkid -o value -s TYPE /dev/docker-disk || true)" = btrfs ] || mkfs.btrfs -q /dev/docker-disk
mount -t btrfs /dev/docker-disk /var/lib/docker
cat >/etc/docker/daemon.json <<'EOF'
{"storage-driver": "btrfs", "exec-opts": ["native.cgroupdriver=systemd"],
 "proxies": {"http-proxy": "http://127.0.0.1:9", "https-proxy": "http://127.0.0.1:9",
             "no-proxy": "127.0.0.1,localhost"}}
EOF
printf '[global]\nno-index = true\nfind-links =\n    /wheels\n    /agent-wheels\n' >/etc/pip.conf
install -m 0755 /stage/bin/* /usr/local/bin/
install -m 0644 /stage/libnvidia-ml.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
install -m 0644 /stage/nvml.conf /etc/fake-nvml.conf
mkdir -p /etc/nvidia-container-runtime  # the toolkit's settings as a careful host has them
printf 'accept-nvidia-visible-devices-envvar-when-unprivileged = false\n' >/etc/nvidia-container-runtime/config.toml
exec /lib/systemd/systemd SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1
"""
HOOK = "#!/bin/sh\n# stand-in: dockerd registers its nvidia device driver when this is on its PATH\nexit 0\n"
HOOK_PATH = "/usr/local/bin/nvidia-container-runtime-hook"
CDI_SPEC = "/etc/cdi/nvidia.yaml"
DRIVER_VERSION = "550.54.15"  # the stand-in NVML's (tests/support/fake_nvml.py's default)
CDI_ENV = "GPUHOST_TEST_CDI_GPU"  # each stand-in GPU's CDI edits set CDI_ENV<index>=<its UUID>
# The host made CDI-only: the stand-in device nodes, dockerd's CDI
# feature on, the runtime hook taken away (dockerd then has no nvidia device
# driver), dockerd restarted (its containers killed first: busybox's sleep as
# PID 1 would hold the restart for its 10 s stop timeout), the agent restarted
# to probe again. The nodes have /dev/null's numbers: the host container's
# device cgroup lets its dockerd give those, not a GPU's (195); CDI applies
# them by path, which is what the test reads.
TO_CDI = f"""set -e
for i in $(seq 0 {GPUS - 1}) ctl; do [ -e /dev/nvidia$i ] || mknod -m 666 /dev/nvidia$i c 1 3; done
python3 -c 'import json; p = "/etc/docker/daemon.json"; d = json.load(open(p)); d["features"] = {{"cdi": True}}; \
json.dump(d, open(p, "w"))'
rm -f {HOOK_PATH}
docker ps -q | xargs -r docker kill >/dev/null
systemctl restart docker.service
systemctl restart gpuhost-agent.service
"""


def cdi_spec() -> str:
    """A CDI spec for the stand-in GPUs, shaped as NVIDIA's generated one
    (`nvidia-ctk cdi generate` with the index and uuid name strategies):
    each GPU by index and by UUID with its device node, `all`, and the nodes
    every GPU brings. Each GPU's edits also name it in an environment
    variable, so a container shows which GPUs it was given. JSON, which is YAML."""
    devices, nodes = [], []
    for index, gpu in enumerate(h100_sxm(GPUS)):
        node = {"path": f"/dev/nvidia{index}"}
        edits = {"deviceNodes": [node], "env": [f"{CDI_ENV}{index}={gpu.uuid}"]}
        devices += [{"name": str(index), "containerEdits": edits}, {"name": gpu.uuid, "containerEdits": edits}]
        nodes.append(node)
    devices.append({"name": "all", "containerEdits": {"deviceNodes": nodes}})
    common = {"deviceNodes": [{"path": "/dev/nvidiactl"}]}
    return json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices, "containerEdits": common})


def gpu_uuids() -> list[str]:
    """The stand-in GPUs' UUIDs by index (NVML's, its minor number's and its CDI spec's)."""
    return [gpu.uuid for gpu in h100_sxm(GPUS)]


def gpu_index(uuid: str) -> int:
    """A stand-in GPU's index (NVML's, and its CDI spec's) from its UUID."""
    return gpu_uuids().index(uuid)


Run = install_chroot.Run  # a command's exit code and output, as the install tests read them


def build() -> tuple[Path, Path]:
    """The cached rootfs and its wheelhouse, built on first use (a few minutes, once)."""
    if os.geteuid() != 0:
        pytest.skip("the modern host needs root")
    for script in ("rootfs-debian13.sh", "rootfs-wheelhouse-debian13.sh"):
        done = subprocess.run(["bash", str(ROOT / "scripts" / script)], capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    return ROOTFS, WHEELS


def image(rootfs: Path) -> str:
    """The rootfs as an image, tagged by its build's stamp: imported once per build."""
    tag = f"{IMAGE}:{(rootfs / '.gpuhost-rootfs-stamp').read_text().strip()[:12]}"
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode != 0:
        subprocess.run(
            f"tar -C {shlex.quote(str(rootfs))} --exclude=./proc --exclude=./sys --exclude=./dev -c . "
            f"| docker import - {tag}",
            shell=True,
            check=True,
            capture_output=True,
            timeout=600,
        )
    return tag


class ModernHost:
    """One booted Debian 13 host: commands run in it as root with `docker exec`."""

    def __init__(self, container: str, gateway: str):
        self.container, self.gateway = container, gateway

    def run(self, *argv: str, input: str | bytes | None = None, timeout: float = 120) -> Run:
        text = not isinstance(input, bytes)
        done = subprocess.run(
            ["docker", "exec", "-i", self.container, *argv],
            input=input,
            capture_output=True,
            text=text,
            timeout=timeout,
        )
        out, err = (done.stdout, done.stderr) if text else (done.stdout.decode(), done.stderr.decode())
        return Run(done.returncode, out, err)

    def sh(self, script: str, *, check: bool = True, timeout: float = 120) -> Run:
        done = self.run("/bin/bash", "-ec", script, timeout=timeout)
        if check:
            assert done.code == 0, f"{script}\n{done.both}"
        return done

    def show(self, unit: str, *names: str) -> dict[str, str]:
        """systemctl show's properties of a unit, as systemd reports them."""
        out = self.sh(f"systemctl show {shlex.quote(unit)} " + " ".join(f"-p {name}" for name in names)).out
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str, since: str | None = None) -> list[dict]:
        """journalctl -u UNIT -o json, one dict per entry."""
        extra = f" --since {shlex.quote(since)}" if since else ""
        out = self.sh(f"journalctl --no-pager -u {shlex.quote(unit)} -o json{extra}").out
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def wait(self, script: str, timeout: float, what: str) -> str:
        """Run `script` until it exits 0; its output."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.sh(script, check=False)
            if done.code == 0:
                return done.out
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} within {timeout} s: {done.both[-2000:]}")
            time.sleep(0.5)

    def read(self, path: str) -> str | None:
        done = self.run("cat", path)
        return done.out if done.code == 0 else None


def _stage(folder: Path) -> Path:
    """The stand-in GPUs (GPUS H100s) and the boot script, for /stage."""
    (folder / "bin").mkdir(parents=True)
    for name, text in {
        "nvidia-smi": install_chroot.FAKE_NVIDIA_SMI,
        "nvidia-ctk": install_chroot.FAKE_NVIDIA_CTK,
        "nvidia-container-runtime-hook": HOOK,
    }.items():
        (folder / "bin" / name).write_text(text)
    (folder / "libnvidia-ml.so.1").write_bytes(build_lib().read_bytes())
    write_config(folder / "nvml.conf", h100_sxm(GPUS))
    (folder / "boot.sh").write_text(BOOT)
    return folder


def _docker(*argv: str, timeout: float = 120) -> str:
    done = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"docker {' '.join(argv)}: {done.stderr}"
    return done.stdout.strip()


@contextlib.contextmanager
def booted(folder: Path, rootfs: Path, wheels: Path, agent_wheels: Path) -> Iterator[ModernHost]:
    """A booted modern host, torn down whatever happens: the container (and with
    it every container its dockerd ran), its network, the loop device and disk."""
    name = f"gpuhost-modern-{uuid.uuid4().hex[:8]}"
    tag = image(rootfs)
    stage = _stage(folder / "stage")
    disk = folder / "docker.btrfs"
    with disk.open("wb") as made:
        made.truncate(DISK_BYTES)
    loop = ""
    network_made = False
    try:
        loop = _loop(disk)
        _docker("network", "create", "--label", TEST_LABEL, name)
        network_made = True
        gateway = json.loads(_docker("network", "inspect", name))[0]["IPAM"]["Config"][0]["Gateway"]
        _docker(
            "run", "-d", "--name", name, "--hostname", "modern-host", "--label", TEST_LABEL,
            "--network", name,
            "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
            "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
            "--security-opt", "systempaths=unconfined", "--cgroupns", "private",
            "--device", f"{loop}:/dev/docker-disk",
            "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
            "-v", f"{stage}:/stage:ro", "-v", f"{wheels}:/wheels:ro", "-v", f"{agent_wheels}:/agent-wheels:ro",
            "--stop-signal", "SIGRTMIN+3",
            tag, "/bin/sh", "/stage/boot.sh",
        )  # fmt: skip
        host = ModernHost(name, gateway)
        host.wait(
            's=$(systemctl is-system-running || true); [ "$s" = running ] || [ "$s" = degraded ]',
            BOOT_SECONDS,
            "systemd running",
        )
        host.wait("docker info >/dev/null", BOOT_SECONDS, "dockerd answering")
        host.sh("systemctl set-environment FAKE_NVML_CONFIG=/etc/fake-nvml.conf")  # the stand-in driver, loaded
        saved = subprocess.run(["docker", "save", TEST_IMAGE], capture_output=True, check=True, timeout=120).stdout
        loaded = host.run("docker", "load", input=saved)
        assert loaded.code == 0, loaded.both
        yield host
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True, timeout=120)
        if network_made:
            subprocess.run(["docker", "network", "rm", name], capture_output=True, timeout=60)
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True, timeout=60)
        disk.unlink(missing_ok=True)


def _loop(disk: Path) -> str:
    """A loop device over the disk file, for the host's /var/lib/docker."""
    return subprocess.run(
        ["losetup", "--find", "--show", str(disk)], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()

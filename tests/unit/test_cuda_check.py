"""The GPU machine's CUDA program (scripts/gpu-machine/cuda-check.c)
against the stand-in libcuda, in a mount namespace of its own whose
/dev holds the nodes a CDI spec would give a container (made with mknod: the
real kernel's character devices). It sees the GPUs whose nodes are there, by
the UUIDs of their minor numbers, copies a pattern there and back, and fails
as the driver does where no node is."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support import fake_cuda

UUIDS = [f"GPU-{i:08x}-0000-4000-8000-{i:012x}" for i in range(8)]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (unshare --mount, mknod)")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("cuda")
    return fake_cuda.build_program(out), fake_cuda.build_stand_in(out, UUIDS)


def _run(built: tuple[Path, Path], nodes: list[str], *arguments: str) -> subprocess.CompletedProcess[str]:
    program, library = built
    made = "; ".join(f"mknod /dev/{node} c 1 3" for node in nodes)
    script = f"mount -t tmpfs none /dev && {made or ':'} && exec {program} {' '.join(arguments)}"
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env={"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(library.parent)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_program_sees_the_gpu_whose_node_it_has_and_copies_there_and_back(built) -> None:
    ran = _run(built, ["nvidiactl", "nvidia-uvm", "nvidia5"], "64")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    assert "cuda-check: devices 1" in lines
    assert f"cuda-check: device 0 {UUIDS[5]} NVIDIA H100 80GB HBM3 (stand-in) 81920 MiB" in lines
    assert "cuda-check: allocated 64 MiB on device 0, copied there and back: equal" in lines
    assert lines[-1] == "cuda-check: PASS"


def test_two_nodes_are_two_devices_in_minor_order(built) -> None:
    ran = _run(built, ["nvidiactl", "nvidia7", "nvidia2"], "1")
    assert ran.returncode == 0, ran.stdout
    assert [line.split()[3] for line in ran.stdout.splitlines() if line.startswith("cuda-check: device ")] == [
        UUIDS[2],
        UUIDS[7],
    ]


def test_without_a_gpus_node_the_driver_says_no_device(built) -> None:
    ran = _run(built, ["nvidiactl"])
    assert ran.returncode == 1
    assert ran.stdout.splitlines()[-1] == "cuda-check: FAIL cuInit: CUDA_ERROR_NO_DEVICE (100)"


def test_without_the_driver_library_it_says_so(built, tmp_path: Path) -> None:
    program, _ = built
    ran = subprocess.run([str(program)], env={"LD_LIBRARY_PATH": str(tmp_path)}, capture_output=True, text=True)
    assert ran.returncode == 1 and ran.stdout.startswith("cuda-check: FAIL dlopen libcuda.so.1"), ran.stdout

"""The GPU machine's CUDA program (scripts/gpu-machine/cuda-check.c) and the
stand-in libcuda.so.1 it runs against here (tests/fake_cuda/fake_libcuda.c),
built with gcc into a folder the caller names. The stand-in answers for the
GPUs whose /dev/nvidia<N> nodes the process sees, with the UUIDs given here
for each minor number (the stand-in NVML's, so that a rental's GPU has the
same UUID in the ledger, in NVML and in CUDA).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "scripts" / "gpu-machine" / "cuda-check.c"
STAND_IN = REPO / "tests" / "fake_cuda" / "fake_libcuda.c"
FLAGS = ["-Wall", "-Wextra", "-Werror", "-O2", "-std=gnu11"]


def build_program(out: Path) -> Path:
    """cuda-check, linked to the C library alone (libcuda comes at run time)."""
    out.mkdir(parents=True, exist_ok=True)
    binary = out / "cuda-check"
    _gcc(*FLAGS, "-o", str(binary), str(PROGRAM), "-ldl")
    return binary


def build_stand_in(out: Path, uuids: Sequence[str]) -> Path:
    """libcuda.so.1 answering minor number i with uuids[i]."""
    out.mkdir(parents=True, exist_ok=True)
    table = out / "stand_in_uuids.h"
    rows = ",\n".join(f'    "{uuid}"' for uuid in uuids)
    table.write_text(f"static const char *const stand_in_uuids[] = {{\n{rows}\n}};\n")
    library = out / "libcuda.so.1"
    _gcc(
        *FLAGS,
        "-shared",
        "-fPIC",
        "-fvisibility=hidden",
        f'-DSTAND_IN_UUIDS="{table}"',
        "-Wl,-soname,libcuda.so.1",
        "-Wl,--no-undefined",
        "-o",
        str(library),
        str(STAND_IN),
    )
    return library


def _gcc(*arguments: str) -> None:
    built = subprocess.run(["gcc", *arguments], capture_output=True, text=True, timeout=120)
    if built.returncode != 0:
        raise RuntimeError(f"gcc {' '.join(arguments)} failed:\n{built.stderr}")


def driver_root(root: Path, uuids: Sequence[str], version: str) -> Path:
    """A stand-in driver root (GPUHOST_DRIVER_ROOT) for the GPUs `uuids`, by minor number: their
    device nodes and the shared ones (mknod, /dev/null's numbers: needs root), the stand-in
    libcuda as the installer lays it out (the versioned file, the loader's soname link), and an
    `nvidia-smi -L` that names the GPUs whose nodes the process sees, as the real one does."""
    dev = root / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    for name in [*(f"nvidia{minor}" for minor in range(len(uuids))), "nvidiactl", "nvidia-uvm"]:
        if not (dev / name).exists():
            os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    libs = root / "usr/lib/x86_64-linux-gnu"
    built = build_stand_in(root / "build", uuids)
    libs.mkdir(parents=True, exist_ok=True)
    shutil.copy(built, libs / f"libcuda.so.{version}")
    (libs / "libcuda.so.1").unlink(missing_ok=True)
    (libs / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
    cases = "\n".join(f"        {minor}) uuid={uuid} ;;" for minor, uuid in enumerate(uuids))
    smi = root / "usr/bin/nvidia-smi"
    smi.parent.mkdir(parents=True, exist_ok=True)
    smi.write_text(
        "#!/bin/sh\n# A stand-in `nvidia-smi -L` (tests/support/fake_cuda.py): the GPUs whose nodes it sees.\n"
        'i=0\nfor node in /dev/nvidia[0-9]*; do\n    [ -c "$node" ] || continue\n    case ${node#/dev/nvidia} in\n'
        f"{cases}\n        *) continue ;;\n    esac\n"
        '    echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: $uuid)"\n    i=$((i + 1))\ndone\n'
    )
    smi.chmod(0o755)
    return root

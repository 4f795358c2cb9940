"""The GPU machine's CUDA program (scripts/gpu-machine/cuda-check.c) and the
stand-in libcuda.so.1 it runs against here (tests/fake_cuda/fake_libcuda.c),
built with gcc into a folder the caller names. The stand-in answers for the
GPUs whose /dev/nvidia<N> nodes the process sees, with the UUIDs given here
for each minor number (the stand-in NVML's, so that a rental's GPU has the
same UUID in the ledger, in NVML and in CUDA).
"""

from __future__ import annotations

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

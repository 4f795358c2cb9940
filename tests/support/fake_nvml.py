"""Test helper for the stand-in NVML library (tests/fake_nvml/fake_nvml.c).

The library lets the real pynvml code path run on machines without a GPU: it
exports NVML's C symbols and answers from a config file. This module builds it,
describes GPUs (`FakeGpu`, presets `rtx4090()` and `h100_sxm()`), writes the
config (`write_config`) and gives the environment a subprocess needs
(`subprocess_env`):

    cfg = write_config(tmp_path / "nvml.conf", h100_sxm(8))
    subprocess.run([...], env={**os.environ, **subprocess_env(cfg)})

In-process use: load the library by full path before pynvml's first
nvmlInit(), so that pynvml's CDLL("libnvidia-ml.so.1") finds it by soname:

    ctypes.CDLL(str(build_lib()), mode=ctypes.RTLD_GLOBAL)
    os.environ["FAKE_NVML_CONFIG"] = str(cfg)
    pynvml.nvmlInit()

Each nvmlInit re-reads the config, so a test can rewrite it, call nvmlShutdown()
and nvmlInit() again, and see the change.
"""

from __future__ import annotations

import functools
import itertools
import subprocess
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-fake-nvml.sh"
DEFAULT_LIB_DIR = REPO / "tests" / ".fake-nvml"
LIB_NAME = "libnvidia-ml.so.1"

MIB = 1 << 20
NVLINK_LINKS = 18  # links per GPU the library knows of; link >= 18 is INVALID_ARGUMENT

# What the rtx4090() preset answers NOT_SUPPORTED for, as a GeForce card does.
GEFORCE_NOT_SUPPORTED = (
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetNvLinkState",
)


@functools.cache
def build_lib(out_dir: str | Path | None = None) -> Path:
    """Build the library if it is missing or stale; return its path (…/libnvidia-ml.so.1).

    Raises RuntimeError with the script's message if it cannot be built (e.g. no gcc).
    """
    cmd = ["bash", str(BUILD_SCRIPT)]
    if out_dir is not None:
        cmd.append(str(out_dir))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT.name} failed ({proc.returncode}): {proc.stderr.strip()}")
    return Path(proc.stdout.strip().splitlines()[-1])


def subprocess_env(config_path: str | Path, *, lib_dir: str | Path | None = None) -> dict[str, str]:
    """The variables that make a subprocess's pynvml use the fake library with this config.

    Merge them over os.environ: {**os.environ, **subprocess_env(cfg)}. LD_LIBRARY_PATH
    is exactly the library's directory, so a real libnvidia-ml.so.1 cannot win.
    Builds the library (into lib_dir, default tests/.fake-nvml/) if needed.
    """
    lib = build_lib(lib_dir)
    return {"LD_LIBRARY_PATH": str(lib.parent), "FAKE_NVML_CONFIG": str(config_path)}


_fresh_bus = itertools.count()


def _fresh_bus_id() -> str:
    n = next(_fresh_bus)
    return f"{n // 255:08X}:{1 + n % 255:02X}:00.0"


@dataclass
class FakeGpu:
    """One GPU as the fake library reports it. Defaults: an idle H100 SXM with a fresh, unique
    identity (random UUID and serial, next free PCI bus id).

    Units are NVML's: bytes, MHz, milliwatts, percent, degrees C. `fail` maps an
    exported function name (e.g. "nvmlDeviceGetMigMode"; a name without _vN also
    covers its versioned symbols) to an NVML error name (e.g. "NOT_SUPPORTED") that
    it returns for this GPU.
    """

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = field(default_factory=lambda: f"GPU-{uuidlib.uuid4()}")
    serial: str = field(default_factory=lambda: f"16549{uuidlib.uuid4().int % 10**8:08d}")
    bus_id: str = field(default_factory=_fresh_bus_id)  # unique in this process
    pci_device_id: int = 0x233010DE  # device id << 16 | vendor id (10DE: NVIDIA)
    pci_subsystem_id: int = 0x16C110DE
    memory_total: int = 81559 * MIB
    memory_used: int = 0
    memory_reserved: int = 0  # memory_v2.reserved; nvmlDeviceGetMemoryInfo v1 counts it as used
    bus_width: int = 5120  # bits
    max_mem_clock: int = 2619  # MHz
    max_graphics_clock: int = 1980
    max_sm_clock: int = 1980
    max_video_clock: int = 1755
    pcie_gen_curr: int = 5
    pcie_gen_max: int = 5
    pcie_width_curr: int = 16
    pcie_width_max: int = 16
    nvlink_up: int = 18  # links 0..nvlink_up-1 are active
    cc: tuple[int, int] = (9, 0)
    mig: tuple[int, int] = (0, 0)  # current, pending
    ecc: tuple[int, int] = (1, 1)  # current, pending
    ecc_uncorrected: int = 0
    power_limit: int = 700_000  # mW
    power_usage: int = 70_000  # mW
    util_gpu: int = 0
    util_mem: int = 0
    temperature: int = 30
    fail: dict[str, str] = field(default_factory=dict)


def _stable_uuid(model: str, index: int) -> str:
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'fake-nvml/{model}/{index}')}"


def rtx4090(n: int = 1) -> list[FakeGpu]:
    """n GeForce RTX 4090 cards (default one): 24564 MiB, no MIG, ECC or NVLink (NOT_SUPPORTED)."""
    return [
        FakeGpu(
            name="NVIDIA GeForce RTX 4090",
            uuid=_stable_uuid("rtx4090", i),
            serial=f"13240{2271 + i:08d}",
            bus_id=f"{i // 8:08X}:{0x01 + 0x20 * (i % 8):02X}:00.0",
            pci_device_id=0x268410DE,
            pci_subsystem_id=0x167C10DE,  # varies by board vendor
            memory_total=24564 * MIB,
            memory_used=0,
            bus_width=384,
            max_mem_clock=10501,
            max_graphics_clock=3120,
            max_sm_clock=3120,
            max_video_clock=2415,
            pcie_gen_curr=4,
            pcie_gen_max=4,
            pcie_width_curr=16,
            pcie_width_max=16,
            nvlink_up=0,
            cc=(8, 9),
            mig=(0, 0),
            ecc=(0, 0),
            power_limit=450_000,
            power_usage=25_000,
            temperature=35,
            fail={function: "NOT_SUPPORTED" for function in GEFORCE_NOT_SUPPORTED},
        )
        for i in range(n)
    ]


# PCI buses of the eight GPUs of an HGX H100 board (as on a DGX H100).
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def h100_sxm(n: int = 8) -> list[FakeGpu]:
    """n H100 SXM GPUs: 81559 MiB HBM3, 18 NVLinks up, MIG off, ECC on, 700 W limit."""
    if not 0 <= n <= 64:
        raise ValueError("the fake library holds at most 64 GPUs")
    gpus = []
    for i in range(n):
        # A second board's buses (n > 8) follow the first one's, in a second PCI domain.
        domain, bus = divmod(i, len(_HGX_BUSES))
        gpus.append(
            FakeGpu(
                uuid=_stable_uuid("h100-sxm", i),
                serial=f"16549220{10421 + i:05d}",
                bus_id=f"{domain:08X}:{_HGX_BUSES[bus]:02X}:00.0",
            )
        )
    return gpus


def _line(*words: object) -> str:
    text = " ".join(str(w) for w in words)
    if "\n" in text or "\r" in text or " #" in text:
        raise ValueError(f"cannot write {text!r} as one config line")
    return text


def _fail_lines(prefix: tuple[object, ...], fail: Mapping[str, str]) -> list[str]:
    return [_line(*prefix, "fail", function, error) for function, error in fail.items()]


def write_config(
    path: str | Path,
    gpus: Iterable[FakeGpu],
    *,
    driver: str = "550.54.15",
    cuda: int = 12040,
    fail: Mapping[str, str] | None = None,
) -> Path:
    """Write the config the library reads: GPU i of `gpus` is NVML index i.

    `fail` maps function names to NVML error names for all GPUs and for system
    functions (e.g. {"nvmlInitWithFlags": "DRIVER_NOT_LOADED"}); FakeGpu.fail is
    per GPU and wins. Returns the path.
    """
    gpus = list(gpus)
    for attr in ("uuid", "bus_id"):
        values = [getattr(g, attr) for g in gpus]
        if len(set(values)) != len(values):
            raise ValueError(f"two GPUs share a {attr}: {values}")
    lines = ["# fake NVML config, written by tests/support/fake_nvml.py", _line("driver", driver), _line("cuda", cuda)]
    lines.append(_line("gpus", len(gpus)))
    lines += _fail_lines((), fail or {})
    for i, g in enumerate(gpus):
        lines += [
            _line("gpu", i, "name", g.name),
            _line("gpu", i, "uuid", g.uuid),
            _line("gpu", i, "serial", g.serial),
            _line("gpu", i, "bus_id", g.bus_id),
            _line("gpu", i, "pci_device_id", hex(g.pci_device_id)),
            _line("gpu", i, "pci_subsystem_id", hex(g.pci_subsystem_id)),
            _line("gpu", i, "cc", f"{g.cc[0]}.{g.cc[1]}"),
            _line("gpu", i, "mig", *g.mig),
            _line("gpu", i, "ecc", *g.ecc),
        ]
        for key in (
            "memory_total", "memory_used", "memory_reserved", "bus_width",
            "max_mem_clock", "max_graphics_clock", "max_sm_clock", "max_video_clock",
            "pcie_gen_curr", "pcie_gen_max", "pcie_width_curr", "pcie_width_max",
            "nvlink_up", "ecc_uncorrected", "power_limit", "power_usage",
            "util_gpu", "util_mem", "temperature",
        ):  # fmt: skip
            lines.append(_line("gpu", i, key, int(getattr(g, key))))
        lines += _fail_lines(("gpu", i), g.fail)
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path


def forget_loaded_nvml() -> None:
    """Undo an in-process load of the fake library (by NvmlProbe's library
    path): pynvml forgets its handle and every dlopen of the file is closed, so
    later tests in this process find no NVML, as on a machine without a GPU."""
    import _ctypes
    import ctypes
    import os

    import pynvml

    path = str(DEFAULT_LIB_DIR / LIB_NAME)
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0
    for _ in range(16):  # one dlclose per dlopen; stop when the file is gone from the map
        if path not in Path("/proc/self/maps").read_text():
            return
        handle = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)._handle
        _ctypes.dlclose(handle)  # the RTLD_NOLOAD reference
        _ctypes.dlclose(handle)  # one earlier reference
    raise RuntimeError(f"{path} is still loaded")

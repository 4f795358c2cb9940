"""The one adapter that owns NVML (pynvml, NVIDIA's own binding).

Every NVML call may fail on its own: consumer cards answer NOT_SUPPORTED for
ECC, MIG and NVLink, older drivers lack whole functions, a GPU can fall off
the bus. So each field is read on its own, a failure becomes `null` plus a
named entry in `unsupported`, and one bad field never costs the others. No
library and no GPU are ordinary answers (``available: false`` with the
reason, or an empty GPU list), never an exception out of this module.

NVML stays initialised between calls: on hosts without persistence mode an
nvmlInit can take seconds, too slow to pay at every heartbeat.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import pynvml

NVLINK_MAX_LINKS = getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)
# Memory clocks reported by NVML are half the effective data rate for both
# HBM and GDDR6/6X, hence the factor 2 (checked against published figures:
# H100 SXM 5120 bit x 2619 MHz -> 3352 GB/s, RTX 4090 384 bit x 10501 MHz -> 1008 GB/s).
DATA_RATE_FACTOR = 2


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def nvml_error_text(exc: BaseException) -> str:
    if isinstance(exc, pynvml.NVMLError):
        try:
            return _text(str(exc))
        except Exception:  # nvmlErrorString itself can be missing
            return f"NVML error {getattr(exc, 'value', '?')}"
    return f"{type(exc).__name__}: {exc}"


def memory_bandwidth_gbps(bus_width_bits: int | None, max_mem_clock_mhz: int | None) -> float | None:
    """Peak memory bandwidth in GB/s (10^9 bytes per second)."""
    if not bus_width_bits or not max_mem_clock_mhz:
        return None
    return round(bus_width_bits / 8 * max_mem_clock_mhz * 1e6 * DATA_RATE_FACTOR / 1e9, 1)


def cuda_version_text(encoded: int | None) -> str | None:
    """NVML's 12040 -> "12.4"."""
    if not encoded:
        return None
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


class FieldReader:
    """Reads fields one by one, remembering which ones NVML could not give."""

    def __init__(self) -> None:
        self.unsupported: dict[str, str] = {}

    def read(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            self.unsupported[name] = nvml_error_text(exc)
            return None


def _memory_in_use(fields: FieldReader, handle: Any) -> int | None:
    """Bytes the GPU's processes hold, as nvidia-smi shows them.

    NVML's first memory call counts the driver's own reservation as used: on
    an idle H200 with driver 580 it said 0.60 GiB where nvidia-smi said 0 MiB
    (docs/hardware/). Its _v2 keeps that reservation apart. Drivers before
    R510 have only the first, so it is the fallback.
    """
    memory = fields.read("memory", pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
    if memory is None:
        memory = fields.read("memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
    return int(memory.used) if memory is not None else None


class NvmlProbe:
    """NVML, opened on first use. Thread-safe: callers run it in a worker thread."""

    def __init__(self, library_path: str | None = None):
        self._library_path = library_path
        self._lock = threading.Lock()
        self._open = False
        self._open_error: str | None = None

    def _ensure_open(self) -> bool:
        if self._open:
            return True
        if self._library_path:
            try:
                # Loaded by full path first; pynvml's later dlopen of the
                # soname libnvidia-ml.so.1 then finds this same object.
                ctypes.CDLL(self._library_path, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                self._open_error = f"cannot load NVML library {self._library_path}: {exc}"
                return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            self._open_error = "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver installed"
            return False
        except pynvml.NVMLError_DriverNotLoaded:
            self._open_error = "NVIDIA driver not loaded (the kernel module is not running)"
            return False
        except pynvml.NVMLError as exc:
            self._open_error = f"NVML failed to initialise: {nvml_error_text(exc)}"
            return False
        self._open, self._open_error = True, None
        return True

    def opened(self) -> bool:
        """NVML open (opened now if it was not): for the GPU event watch, which
        shares this one initialisation."""
        with self._lock:
            return self._ensure_open()

    def close(self) -> None:
        with self._lock:
            if self._open:
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError:
                    pass
                self._open = False

    def inventory(self) -> dict:
        """Driver facts and every GPU, for systemData."""
        with self._lock:
            if not self._ensure_open():
                return {
                    "available": False,
                    "error": self._open_error,
                    "driverVersion": None,
                    "cudaDriverVersion": None,
                    "gpus": [],
                }
            system = FieldReader()
            driver = system.read("driverVersion", pynvml.nvmlSystemGetDriverVersion)
            cuda = system.read("cudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion)
            count = system.read("deviceCount", pynvml.nvmlDeviceGetCount)
            gpus = [self._gpu(index) for index in range(count or 0)]
            return {
                "available": True,
                "error": system.unsupported.get("deviceCount"),
                "driverVersion": _text(driver) if driver is not None else None,
                "cudaDriverVersion": cuda_version_text(cuda),
                "gpus": gpus,
                "unsupported": system.unsupported,
            }

    def _gpu(self, index: int) -> dict:
        fields = FieldReader()
        handle = fields.read("handle", pynvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return {"index": index, "error": fields.unsupported["handle"], "unsupported": fields.unsupported}
        read = fields.read
        name = read("name", pynvml.nvmlDeviceGetName, handle)
        uuid = read("uuid", pynvml.nvmlDeviceGetUUID, handle)
        pci = read("pciBusId", pynvml.nvmlDeviceGetPciInfo, handle)
        memory = read("memoryTotalBytes", pynvml.nvmlDeviceGetMemoryInfo, handle)
        bus_width = read("memoryBusWidthBits", pynvml.nvmlDeviceGetMemoryBusWidth, handle)
        mem_clock = read("maxMemoryClockMHz", pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM)
        cc = read("computeCapability", pynvml.nvmlDeviceGetCudaComputeCapability, handle)
        mig = read("migMode", pynvml.nvmlDeviceGetMigMode, handle)
        ecc = read("eccMode", pynvml.nvmlDeviceGetEccMode, handle)
        ecc_errors = read(
            "eccUncorrectedErrors",
            pynvml.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        power_limit = read("powerLimitW", pynvml.nvmlDeviceGetPowerManagementLimit, handle)
        return {
            "index": index,
            "minorNumber": read("minorNumber", pynvml.nvmlDeviceGetMinorNumber, handle),  # its /dev/nvidia<minor>
            "uuid": _text(uuid) if uuid is not None else None,
            "name": _text(name) if name is not None else None,
            "pciBusId": _text(pci.busId) if pci is not None else None,
            "memoryTotalBytes": int(memory.total) if memory is not None else None,
            "memoryBusWidthBits": bus_width,
            "maxMemoryClockMHz": mem_clock,
            "memoryBandwidthGBps": memory_bandwidth_gbps(bus_width, mem_clock),
            "pcie": {
                "genCurrent": read("pcie.genCurrent", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
                "genMax": read("pcie.genMax", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                "widthCurrent": read("pcie.widthCurrent", pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
                "widthMax": read("pcie.widthMax", pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
            },
            "nvlinkLinksUp": self._nvlinks_up(handle, fields),
            "computeCapability": f"{cc[0]}.{cc[1]}" if cc is not None else None,
            "migMode": {"current": bool(mig[0]), "pending": bool(mig[1])} if mig is not None else None,
            "eccMode": {"current": bool(ecc[0]), "pending": bool(ecc[1])} if ecc is not None else None,
            "eccUncorrectedErrors": ecc_errors,
            "powerLimitW": round(power_limit / 1000, 1) if power_limit is not None else None,
            "unsupported": fields.unsupported,
        }

    @staticmethod
    def _nvlinks_up(handle: Any, fields: FieldReader) -> int | None:
        """Active NVLink links; None when the GPU has no NVLink support at all."""
        up = 0
        for link in range(NVLINK_MAX_LINKS):
            try:
                up += 1 if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED else 0
            except pynvml.NVMLError_InvalidArgument:
                break  # past this GPU's last link
            except pynvml.NVMLError as exc:
                if link == 0:
                    fields.unsupported["nvlinkLinksUp"] = nvml_error_text(exc)
                    return None
                break
        return up

    def telemetry(self) -> list[dict]:
        """Live per-GPU figures for a heartbeat; empty when NVML is unavailable."""
        with self._lock:
            if not self._ensure_open():
                return []
            count = FieldReader().read("deviceCount", pynvml.nvmlDeviceGetCount) or 0
            beats = []
            for index in range(count):
                fields = FieldReader()
                handle = fields.read("handle", pynvml.nvmlDeviceGetHandleByIndex, index)
                if handle is None:
                    beats.append({"index": index, "error": fields.unsupported["handle"]})
                    continue
                util = fields.read("utilization", pynvml.nvmlDeviceGetUtilizationRates, handle)
                memory = _memory_in_use(fields, handle)
                temperature = fields.read(
                    "temperature", pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
                )
                power = fields.read("power", pynvml.nvmlDeviceGetPowerUsage, handle)
                uuid = fields.read("uuid", pynvml.nvmlDeviceGetUUID, handle)
                beats.append(
                    {
                        "index": index,
                        "uuid": _text(uuid) if uuid is not None else None,
                        "utilizationPercent": util.gpu if util is not None else None,
                        "memoryUsedBytes": memory,
                        "temperatureC": temperature,
                        "powerW": round(power / 1000, 1) if power is not None else None,
                    }
                )
            return beats

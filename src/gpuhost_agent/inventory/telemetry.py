"""Live figures for the heartbeat: host load and per-GPU use.

Cheap by design (a few /proc reads and one NVML pass), because it runs at every
beat; the full inventory is probed on its own, slower schedule.
"""

from __future__ import annotations

import os

import psutil

from gpuhost_agent.inventory.nvml_probe import NvmlProbe


def host_load(storage_path: str | None) -> dict:
    load1, load5, load15 = os.getloadavg()
    memory = psutil.virtual_memory()
    figures = {
        "load1": round(load1, 2),
        "load5": round(load5, 2),
        "load15": round(load15, 2),
        "cpuPercent": psutil.cpu_percent(interval=None),
        "memoryUsedBytes": memory.total - memory.available,
        "memoryTotalBytes": memory.total,
        "diskFreeBytes": None,
    }
    if storage_path:
        try:
            figures["diskFreeBytes"] = psutil.disk_usage(storage_path).free
        except OSError:
            pass
    return figures


def snapshot(nvml: NvmlProbe, storage_path: str | None) -> dict:
    """Blocking (NVML); call it from a worker thread."""
    return {"host": host_load(storage_path), "gpus": nvml.telemetry()}


def gpu_busy(nvml: NvmlProbe) -> dict[str, float]:
    """Each GPU's utilisation in percent, by UUID (the usage meter's "busy");
    GPUs NVML cannot read are left out. Blocking (NVML)."""
    return {
        beat["uuid"]: float(beat["utilizationPercent"])
        for beat in nvml.telemetry()
        if beat.get("uuid") and beat.get("utilizationPercent") is not None
    }


def boot_time() -> float:
    """When the machine last booted (epoch seconds): the usage meter tells a
    machine that stayed up from one that restarted while the agent was away."""
    return psutil.boot_time()

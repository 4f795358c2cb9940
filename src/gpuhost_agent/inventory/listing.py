"""The Listing's hardware fields, derived from a probe. Pure.

Units (the seed leaves them open; docs/agent-api.yaml states them too):
  gpuVRAM       GiB per GPU, whole number (NVML's total memory, rounded: 81559 MiB -> 80)
  gpuBandwidth  GB/s (10^9 bytes/s) peak memory bandwidth per GPU
  gpuCUDA       highest CUDA version the driver supports, "12.4"
  gpuInterconnect  "NVLink" when the machine has several GPUs and every one has NVLink
                links up (NVML does not tell cheaply whether a link ends at a peer GPU or
                an NVSwitch; both mean NVLink between the GPUs), else "PCIe"
  totalCPUs     logical CPUs
  totalRAM      GiB, one decimal
  totalStorage  GiB, whole number: size of the filesystem of Docker's data root
  network*Speed Mbit/s (10^6 bits/s), measured against the marketplace
A field the probe could not measure is null, never a guess.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

GIB = 1024**3


def _gib(value: int | None, digits: int = 0) -> float | int | None:
    if value is None:
        return None
    rounded = round(value / GIB, digits)
    return int(rounded) if digits == 0 else rounded


def common_gpu_name(gpus: list[dict]) -> str | None:
    names = Counter(gpu.get("name") for gpu in gpus if gpu.get("name"))
    return names.most_common(1)[0][0] if names else None


def interconnect(gpus: list[dict]) -> str | None:
    if not gpus:
        return None
    if len(gpus) > 1 and all((gpu.get("nvlinkLinksUp") or 0) > 0 for gpu in gpus):
        return "NVLink"
    return "PCIe"


def _smallest(gpus: list[dict], key: str) -> Any:
    """The figure a renter can count on for any GPU of the machine."""
    values = [gpu[key] for gpu in gpus if gpu.get(key) is not None]
    return min(values) if len(values) == len(gpus) and values else None


def listing_fields(system_data: dict, speed: dict | None, location: str | None) -> dict:
    gpus = [gpu for gpu in system_data["nvml"]["gpus"] if not gpu.get("error")]
    host = system_data["host"]
    vram = _smallest(gpus, "memoryTotalBytes")
    environment = system_data.get("environment")  # a Swarm environment: every machine's GPUs
    return {
        "totalGPUs": int(environment.get("gpus") or 0) if environment else len(gpus),
        "gpuName": common_gpu_name(gpus),
        "gpuVRAM": _gib(vram),
        "gpuBandwidth": _smallest(gpus, "memoryBandwidthGBps"),
        "gpuInterconnect": interconnect(gpus),
        "gpuCUDA": system_data["nvml"].get("cudaDriverVersion"),
        "totalCPUs": host["cpu"]["logicalCores"],
        "totalRAM": _gib(host["memory"]["totalBytes"], 1),
        "totalStorage": _gib(host["storage"]["totalBytes"]),
        "networkUploadSpeed": (speed or {}).get("uploadMbps"),
        "networkDownloadSpeed": (speed or {}).get("downloadMbps"),
        "location": location or None,
    }

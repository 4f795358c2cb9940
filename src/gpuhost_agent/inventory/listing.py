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

A Swarm environment is listed as one: the leader's probe carries each other
machine's own systemData (environment.nodes[].machine), and the hardware
fields are the machines' together. totalGPUs is every node's GPUs (Swarm's
count, which includes a machine whose agent is silent); the CPU, memory and
disk totals are sums over the machines that reported, null when one of them
could not measure its figure; per-GPU figures are the ones a renter can count
on for any GPU (the smallest VRAM and bandwidth, the oldest CUDA), the name
the most common model's, and "NVLink" only when each machine's GPUs are on
NVLink (between machines it is the network). The network speeds are the
leader's, the machine that talks to the marketplace.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
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


def reported_machines(system_data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """This machine's systemData and, on a Swarm leader, each other machine's
    that reported (a silent machine's hardware is not known)."""
    nodes = (system_data.get("environment") or {}).get("nodes") or []
    others = [(node.get("machine") or {}).get("systemData") for node in nodes]
    return [system_data, *(data for data in others if isinstance(data, dict))]


def _total(values: list[Any]) -> Any:
    return None if any(value is None for value in values) else sum(values)


def _oldest_cuda(versions: list[Any]) -> str | None:
    known = [str(version) for version in versions if version]
    numeric = [version for version in known if version.replace(".", "").isdigit()]
    return min(numeric, key=lambda version: tuple(int(part) for part in version.split(".")), default=None)


def listing_fields(system_data: Mapping[str, Any], speed: dict | None, location: str | None) -> dict:
    machines = reported_machines(system_data)
    nvmls = [machine.get("nvml") or {} for machine in machines]
    per_machine = [[gpu for gpu in nvml.get("gpus") or [] if not gpu.get("error")] for nvml in nvmls]
    gpus = [gpu for machine_gpus in per_machine for gpu in machine_gpus]
    hosts = [machine.get("host") or {} for machine in machines]
    links = {interconnect(machine_gpus) for machine_gpus in per_machine if machine_gpus}
    environment = system_data.get("environment")  # a Swarm environment: every machine's GPUs
    return {
        "totalGPUs": int(environment.get("gpus") or 0) if environment else len(gpus),
        "gpuName": common_gpu_name(gpus),
        "gpuVRAM": _gib(_smallest(gpus, "memoryTotalBytes")),
        "gpuBandwidth": _smallest(gpus, "memoryBandwidthGBps"),
        "gpuInterconnect": (links.pop() if len(links) == 1 else "PCIe") if links else None,
        "gpuCUDA": _oldest_cuda([nvml.get("cudaDriverVersion") for nvml in nvmls]),
        "totalCPUs": _total([(host.get("cpu") or {}).get("logicalCores") for host in hosts]),
        "totalRAM": _gib(_total([(host.get("memory") or {}).get("totalBytes") for host in hosts]), 1),
        "totalStorage": _gib(_total([(host.get("storage") or {}).get("totalBytes") for host in hosts])),
        "networkUploadSpeed": (speed or {}).get("uploadMbps"),
        "networkDownloadSpeed": (speed or {}).get("downloadMbps"),
        "location": location or None,
    }

"""Probes of a machine, shaped as the agent builds them, for the tests of the
checks and reports made of them.

good_host(): a probe that passes every compliance check (inventory.compliance).
healthy_system_data(), broken_system_data(), GPU_BEATS: systemData and heartbeat
GPU figures as Prober.system_data() and NvmlProbe.telemetry() build them, for the
checks of docs/agent-api.yaml.
"""

from __future__ import annotations

from gpuhost_agent.inventory import netspeed
from gpuhost_agent.protocol import wire_time

GIB = 1024**3


def _h100(index: int) -> dict:
    """One GPU as inventory/nvml_probe.py reports it (an H100 SXM, every field read)."""
    return {
        "index": index,
        "uuid": f"GPU-aacd9ec3-13e4-58c1-ada1-81eabee5fd{index:02x}",
        "name": "NVIDIA H100 80GB HBM3",
        "pciBusId": f"00000000:{0x18 + 0x12 * index:02X}:00.0",
        "memoryTotalBytes": 81559 * 1024**2,
        "memoryBusWidthBits": 5120,
        "maxMemoryClockMHz": 2619,
        "memoryBandwidthGBps": 3352.3,
        "pcie": {"genCurrent": 5, "genMax": 5, "widthCurrent": 16, "widthMax": 16},
        "nvlinkLinksUp": 18,
        "computeCapability": "9.0",
        "migMode": {"current": False, "pending": False},
        "eccMode": {"current": True, "pending": True},
        "eccUncorrectedErrors": 0,
        "powerLimitW": 700.0,
        "unsupported": {},
    }


def healthy_system_data() -> dict:
    """systemData of a rentable machine, shaped as Prober.system_data() builds it: three
    GPUs, of which GPU 1 could not give some fields (null, named in `unsupported`) and
    GPU 2 fell off the bus."""
    partial = _h100(1)
    partial["pcie"]["genMax"] = partial["powerLimitW"] = partial["migMode"] = None
    partial["unsupported"] = {
        "pcie.genMax": "Not Supported",
        "powerLimitW": "Not Supported",
        "migMode": "Function Not Found",
    }
    speed = netspeed.SpeedResult(
        download_mbps=936.8,
        upload_mbps=941.2,
        download_bytes=25_000_000,
        upload_bytes=25_000_000,
        measured_at=wire_time.iso(),
    )
    return {
        "probedAt": wire_time.iso(),
        "agentVersion": "0.1.0",
        "hostname": "gpu-host-7",
        "nvml": {
            "available": True,
            "error": None,
            "driverVersion": "550.54.15",
            "cudaDriverVersion": "12.4",
            "gpus": [_h100(0), partial, {"index": 2, "error": "GPU is lost", "unsupported": {"handle": "GPU is lost"}}],
            "unsupported": {},
        },
        "host": {
            "cpu": {"model": "Intel(R) Xeon(R) Platinum 8480+", "physicalCores": 112, "logicalCores": 224},
            "memory": {"totalBytes": 2164236267520},
            "storage": {
                "path": "/var/lib/docker",
                "totalBytes": 3840755982336,
                "freeBytes": 3500000000000,
                "error": None,
            },
            "os": {"name": "Ubuntu 22.04.4 LTS", "kernel": "5.15.0-105-generic", "arch": "x86_64"},
            "docker": {
                "available": True,
                "error": None,
                "version": "27.3.1",
                "apiVersion": "1.47",
                "rootDir": "/var/lib/docker",
                "runtimes": ["nvidia", "runc"],
                "defaultRuntime": "runc",
                "cdiSpecDirs": ["/etc/cdi", "/var/run/cdi"],
                "cgroupDriver": "systemd",
                "cgroupVersion": "2",
                "swarm": {"state": "inactive", "nodeId": None, "manager": False, "nodes": None},
                "gpuContainers": {"ok": True, "method": "engine-info", "detail": "nvidia runtime registered"},
                "gpuDelivery": {"method": "runtime-hook", "detail": "nvidia runtime registered"},
                "noNewPrivileges": {"default": False, "detail": "dockerd pid 812: /etc/docker/daemon.json"},
                "cgroupnsPrivate": {"default": True, "detail": "dockerd pid 812: /etc/docker/daemon.json"},
                "storageQuota": {
                    "available": False,
                    "detail": "overlay2 on extfs: a size per container needs XFS with project quotas",
                },
                "rentalLimits": {"perRental": True, "detail": "a cgroup per rental (cgroupfs, cgroup v1)"},
                "proxies": {"http": "http://127.0.0.1:47128", "https": "http://127.0.0.1:47128", "no": ""},
                "fence": {"group": 990, "dockerd": True, "detail": None},
                "cdiSpec": {"path": None, "detail": "dockerd's CDI feature is off: no spec written"},
            },
            "compose": {"available": True, "version": "2.29.1", "command": "docker compose", "error": None},
            "nvidiaContainerToolkit": {
                "installed": True,
                "version": "1.17.8",
                "binaries": ["nvidia-container-runtime-hook", "nvidia-ctk"],
                "configPath": "/etc/nvidia-container-runtime/config.toml",
                "configFound": True,
                "acceptsEnvvarFromUnprivileged": False,
            },
            "clock": {"synchronized": True, "maxErrorMs": 12.5, "source": "adjtimex"},
            "egress": {"confined": True, "differs": None, "error": None},
            "pullGuard": {"listen": "127.0.0.1:47128", "error": None},
        },
        "networkSpeed": netspeed.as_wire(speed),
        "location": "DE-Frankfurt",
    }


def broken_system_data() -> dict:
    """systemData of a machine with no driver, no Docker, no Compose, no toolkit."""
    return {
        "probedAt": wire_time.iso(),
        "agentVersion": "0.1.0",
        "hostname": "new-host",
        "nvml": {
            "available": False,
            "error": "NVIDIA driver not loaded (the kernel module is not running)",
            "driverVersion": None,
            "cudaDriverVersion": None,
            "gpus": [],
        },
        "host": {
            "cpu": {"model": None, "physicalCores": None, "logicalCores": 8},
            "memory": {"totalBytes": 33546305536},
            "storage": {
                "path": "/var/lib/docker",
                "totalBytes": None,
                "freeBytes": None,
                "error": "[Errno 13] Permission denied: '/var/lib/docker'",
            },
            "os": {"name": None, "kernel": "6.8.0-31-generic", "arch": "x86_64"},
            "docker": {
                "available": False,
                "error": "Cannot connect to the Docker daemon",
                "version": None,
                "rootDir": None,
                "gpuContainers": {"ok": False, "method": "none", "detail": "Docker Engine unreachable"},
                "gpuDelivery": {"method": "none", "detail": "Docker Engine unreachable"},
            },
            "compose": {"available": False, "version": None, "command": None, "error": "Docker Compose v2 not found"},
            "nvidiaContainerToolkit": {
                "installed": False,
                "version": None,
                "binaries": [],
                "configPath": "/etc/nvidia-container-runtime/config.toml",
                "configFound": False,
                "acceptsEnvvarFromUnprivileged": True,
            },
            "clock": {"synchronized": None, "maxErrorMs": None, "source": "unavailable"},
            "egress": {
                "confined": False,
                "differs": None,
                "error": "iptables is not installed: a rental's containers can reach the host and its networks",
            },
        },
        "networkSpeed": None,
        "location": None,
    }


# Heartbeat GPU figures as NvmlProbe.telemetry() reports them (GPU 2 fell off the bus).
GPU_BEATS = [
    {
        "index": 0,
        "uuid": "GPU-aacd9ec3-13e4-58c1-ada1-81eabee5fd00",
        "utilizationPercent": 97,
        "memoryUsedBytes": 71 * GIB,
        "temperatureC": 64,
        "powerW": 612.4,
    },
    {
        "index": 1,
        "uuid": "GPU-aacd9ec3-13e4-58c1-ada1-81eabee5fd01",
        "utilizationPercent": None,
        "memoryUsedBytes": 0,
        "temperatureC": 31,
        "powerW": None,
    },
    {"index": 2, "error": "GPU is lost"},
]


def heartbeat(sent_at: str = "2026-11-21T10:00:00Z", **changes) -> dict:
    """A whole heartbeat as the agent sends one (the marketplace checks every documented field)."""
    return {
        "sentAt": sent_at,
        "agentVersion": "0.1.0",
        "uptimeSeconds": 12.5,
        "initState": "ready",
        "fingerprint": None,
        "host": {
            "load1": 0.5,
            "load5": 0.4,
            "load15": 0.3,
            "cpuPercent": 3.5,
            "memoryUsedBytes": 8 * GIB,
            "memoryTotalBytes": 2015 * GIB,
            "diskFreeBytes": None,
        },
        "gpus": [dict(gpu) for gpu in GPU_BEATS],
        **changes,
    }


def _gpu(index: int, name: str = "NVIDIA H100 80GB HBM3") -> dict:
    return {
        "index": index,
        "name": name,
        "uuid": f"GPU-{index}",
        "eccUncorrectedErrors": 0,
        "nvlinkLinksUp": 18,
        "memoryTotalBytes": 80 * GIB,
        "memoryBandwidthGBps": 3352.3,
        "unsupported": {},
    }


def good_host() -> dict:
    """A probe of a host that passes every check."""
    return {
        "nvml": {
            "available": True,
            "error": None,
            "driverVersion": "550.54.15",
            "cudaDriverVersion": "12.4",
            "gpus": [_gpu(0), _gpu(1)],
        },
        "host": {
            "docker": {
                "available": True,
                "error": None,
                "version": "27.3.1",
                "gpuContainers": {"ok": True, "method": "container", "detail": None},
                "gpuDelivery": {"method": "runtime-hook", "detail": "nvidia-container-runtime-hook at /usr/bin/x"},
                "swarm": {"state": "inactive", "nodeId": None, "manager": False, "nodes": None},
                "noNewPrivileges": {"default": False, "detail": "dockerd pid 812: /etc/docker/daemon.json"},
                "cgroupnsPrivate": {"default": True, "detail": "dockerd pid 812: /etc/docker/daemon.json"},
                "storageQuota": {
                    "available": False,
                    "detail": "overlay2 on extfs: a size per container needs XFS with project quotas",
                },
                "rentalLimits": {"perRental": True, "detail": "a cgroup per rental (cgroupfs, cgroup v1)"},
                "proxies": {"http": "http://127.0.0.1:47128", "https": "http://127.0.0.1:47128", "no": ""},
                "fence": {"group": 990, "dockerd": True, "detail": None},
                "cdiSpec": {"path": None, "detail": "dockerd's CDI feature is off: no spec written"},
            },
            "compose": {"available": True, "version": "2.29.7", "error": None},
            "nvidiaContainerToolkit": {
                "installed": True,
                "version": "1.17.8",
                "binaries": ["nvidia-ctk"],
                "configPath": "/etc/nvidia-container-runtime/config.toml",
                "acceptsEnvvarFromUnprivileged": False,
            },
            "storage": {"path": "/var/lib/docker", "totalBytes": 2000 * GIB, "freeBytes": 800 * GIB},
            "clock": {"synchronized": True, "maxErrorMs": 3.2, "source": "adjtimex"},
            "egress": {"confined": True, "differs": None, "error": None},
            "pullGuard": {"listen": "127.0.0.1:47128", "error": None},
        },
    }

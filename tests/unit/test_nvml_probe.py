"""The real pynvml code path of NvmlProbe against the stand-in libnvidia-ml.so.1,
configured per test: what a host's listing and compliance are built from."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

import pytest
from support.fake_nvml import FakeGpu, build_lib, forget_loaded_nvml, h100_sxm, rtx4090, subprocess_env, write_config
from support.openapi_check import AGENT_DOC, check, load, properties, request_schema

from gpuhost_agent.inventory.listing import listing_fields
from gpuhost_agent.inventory.nvml_probe import NvmlProbe


@pytest.fixture
def nvml(tmp_path, monkeypatch):
    """configure(gpus, **kw) writes the fake's config; returns a fresh NvmlProbe on the fake."""
    library = str(build_lib())
    config = tmp_path / "nvml.conf"
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(config))
    probes: list[NvmlProbe] = []

    def configure(gpus, **kwargs) -> NvmlProbe:
        write_config(config, gpus, **kwargs)
        probe = NvmlProbe(library)
        probes.append(probe)
        return probe

    yield configure
    for probe in probes:
        probe.close()
    forget_loaded_nvml()


def _listing(inventory: dict) -> dict:
    host = {"cpu": {"logicalCores": 8}, "memory": {"totalBytes": 64 * 1024**3}, "storage": {"totalBytes": 2 * 1024**4}}
    return listing_fields({"nvml": inventory, "host": host}, {"uploadMbps": 900.5, "downloadMbps": 940.1}, "DE-Berlin")


def test_consumer_card_reports_what_it_has_and_names_what_it_lacks(nvml) -> None:
    inventory = nvml(rtx4090()).inventory()
    assert inventory["available"] and inventory["driverVersion"] == "550.54.15"
    assert inventory["cudaDriverVersion"] == "12.4"
    [gpu] = inventory["gpus"]
    assert gpu["name"] == "NVIDIA GeForce RTX 4090" and gpu["uuid"].startswith("GPU-")
    assert gpu["memoryTotalBytes"] == 24564 * 1024**2
    assert gpu["memoryBandwidthGBps"] == 1008.1
    assert gpu["pcie"] == {"genCurrent": 4, "genMax": 4, "widthCurrent": 16, "widthMax": 16}
    assert gpu["computeCapability"] == "8.9"
    # NOT_SUPPORTED fields are null and named, and cost nothing else.
    assert gpu["migMode"] is None and gpu["eccMode"] is None and gpu["eccUncorrectedErrors"] is None
    assert gpu["nvlinkLinksUp"] is None
    assert set(gpu["unsupported"]) == {"migMode", "eccMode", "eccUncorrectedErrors", "nvlinkLinksUp"}
    assert all("Not Supported" in text for text in gpu["unsupported"].values())
    listing = _listing(inventory)
    assert listing["gpuVRAM"] == 24 and listing["gpuInterconnect"] == "PCIe" and listing["gpuBandwidth"] == 1008.1


def test_eight_gpu_nvlink_machine(nvml) -> None:
    inventory = nvml(h100_sxm(8)).inventory()
    gpus = inventory["gpus"]
    assert [gpu["index"] for gpu in gpus] == list(range(8))
    assert len({gpu["uuid"] for gpu in gpus}) == 8 and len({gpu["pciBusId"] for gpu in gpus}) == 8
    assert all(gpu["nvlinkLinksUp"] == 18 and gpu["unsupported"] == {} for gpu in gpus)
    assert gpus[0]["migMode"] == {"current": False, "pending": False}
    assert gpus[0]["eccMode"] == {"current": True, "pending": True} and gpus[0]["eccUncorrectedErrors"] == 0
    assert gpus[0]["powerLimitW"] == 700.0
    assert _listing(inventory) == {
        "totalGPUs": 8,
        "gpuName": "NVIDIA H100 80GB HBM3",
        "gpuVRAM": 80,
        "gpuBandwidth": 3352.3,
        "gpuInterconnect": "NVLink",
        "gpuCUDA": "12.4",
        "totalCPUs": 8,
        "totalRAM": 64.0,
        "totalStorage": 2048,
        "networkUploadSpeed": 900.5,
        "networkDownloadSpeed": 940.1,
        "location": "DE-Berlin",
    }


def test_nvlink_down_means_pcie(nvml) -> None:
    gpus = h100_sxm(2)
    gpus[1].nvlink_up = 0
    assert _listing(nvml(gpus).inventory())["gpuInterconnect"] == "PCIe"


def test_no_gpu_is_an_answer_not_a_crash(nvml) -> None:
    inventory = nvml([]).inventory()
    assert inventory["available"] is True and inventory["gpus"] == []
    assert _listing(inventory)["totalGPUs"] == 0 and _listing(inventory)["gpuName"] is None


def test_mixed_models_listed_under_the_most_common(nvml) -> None:
    gpus = h100_sxm(3) + rtx4090(1)
    inventory = nvml(gpus).inventory()
    assert sorted({gpu["name"] for gpu in inventory["gpus"]}) == ["NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3"]
    listing = _listing(inventory)
    assert listing["gpuName"] == "NVIDIA H100 80GB HBM3"
    assert listing["gpuVRAM"] == 24  # what a renter can count on for any GPU of the machine


def test_older_driver_without_a_function_loses_only_that_field(nvml) -> None:
    probe = nvml(
        h100_sxm(2),
        fail={
            "nvmlDeviceGetMemoryBusWidth": "FUNCTION_NOT_FOUND",
            "nvmlSystemGetCudaDriverVersion": "FUNCTION_NOT_FOUND",
        },
    )
    inventory = probe.inventory()
    assert inventory["cudaDriverVersion"] is None and "cudaDriverVersion" in inventory["unsupported"]
    gpu = inventory["gpus"][0]
    assert gpu["memoryBusWidthBits"] is None and gpu["memoryBandwidthGBps"] is None
    assert "Function Not Found" in gpu["unsupported"]["memoryBusWidthBits"]
    assert gpu["maxMemoryClockMHz"] == 2619 and gpu["memoryTotalBytes"] and gpu["nvlinkLinksUp"] == 18
    assert _listing(inventory)["gpuBandwidth"] is None  # unknown, never a guess


def test_a_lost_gpu_does_not_hide_the_others(nvml) -> None:
    gpus = h100_sxm(4)
    gpus[2].fail = {"nvmlDeviceGetHandleByIndex": "GPU_IS_LOST"}
    inventory = nvml(gpus).inventory()
    assert "GPU is lost" in inventory["gpus"][2]["error"]
    assert [gpu.get("name") for gpu in inventory["gpus"]].count("NVIDIA H100 80GB HBM3") == 3
    assert _listing(inventory)["totalGPUs"] == 3


def test_driver_not_loaded_is_reported_as_such(nvml, monkeypatch) -> None:
    probe = nvml(h100_sxm(1))
    monkeypatch.delenv("FAKE_NVML_CONFIG")  # the fake then answers as a machine whose kernel module is not loaded
    inventory = probe.inventory()
    assert inventory == {
        "available": False,
        "error": "NVIDIA driver not loaded (the kernel module is not running)",
        "driverVersion": None,
        "cudaDriverVersion": None,
        "gpus": [],
    }
    assert probe.telemetry() == []


def test_telemetry_reads_live_figures(nvml) -> None:
    gpus = h100_sxm(2)
    gpus[1] = FakeGpu(
        **{**gpus[1].__dict__, "util_gpu": 87, "memory_used": 40 * 1024**3, "temperature": 71, "power_usage": 612_345}
    )
    beats = nvml(gpus).telemetry()
    assert beats[1] == {
        "index": 1,
        "uuid": gpus[1].uuid,
        "utilizationPercent": 87,
        "memoryUsedBytes": 40 * 1024**3,
        "temperatureC": 71,
        "powerW": 612.3,
    }
    assert beats[0]["utilizationPercent"] == 0


def test_memory_in_use_leaves_out_the_drivers_reservation(nvml) -> None:
    """As nvidia-smi does: a real H200 had 0.60 GiB reserved on an idle GPU."""
    gpus = h100_sxm(2)
    for gpu in gpus:
        gpu.memory_used, gpu.memory_reserved = 40 * 1024**3, 600 * 1024**2
    gpus[1].fail["nvmlDeviceGetMemoryInfo_v2"] = "FUNCTION_NOT_FOUND"  # a driver before R510
    beats = nvml(gpus).telemetry()
    assert beats[0]["memoryUsedBytes"] == 40 * 1024**3
    assert beats[1]["memoryUsedBytes"] == 40 * 1024**3 + 600 * 1024**2  # all such a driver tells


def _cli_probe(env: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "gpuhost_agent", "probe", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_cli_probe_finds_the_library_through_ld_library_path(tmp_path) -> None:
    config = write_config(tmp_path / "nvml.conf", rtx4090())
    report = _cli_probe({**os.environ, **subprocess_env(config), "GPUHOST_LOCATION": "US-TX"})
    assert report["listing"]["gpuName"] == "NVIDIA GeForce RTX 4090"
    assert report["listing"]["location"] == "US-TX"
    assert report["systemData"]["nvml"]["gpus"][0]["unsupported"]["migMode"] == "Not Supported"
    # Exactly the body PUT /agent/system-data carries: every field of it, no other.
    agent_doc = load(AGENT_DOC)
    assert set(report) == properties(agent_doc, "SystemDataReport")
    check(agent_doc, report, request_schema(agent_doc, "/agent/system-data", "put"))


@pytest.mark.skipif(bool(ctypes.util.find_library("nvidia-ml")), reason="this machine has a real NVML library")
def test_cli_probe_without_any_nvml_library(tmp_path) -> None:
    env = {key: value for key, value in os.environ.items() if key not in ("LD_LIBRARY_PATH", "FAKE_NVML_CONFIG")}
    report = _cli_probe(env)
    nvml = report["systemData"]["nvml"]
    assert nvml["available"] is False and "libnvidia-ml.so.1" in nvml["error"]
    assert report["listing"]["totalGPUs"] == 0
    checks = {c["id"]: c for c in report["compliance"]["checks"]}
    assert not checks["nvidia-gpu"]["ok"] and "install the NVIDIA driver" in checks["nvidia-gpu"]["remedy"]
    # The missing driver fails nvidia-gpu alone; what needs a driver or a GPU is skipped, not passed.
    for needs_a_gpu in ("driver-version", "cuda-version", "gpu-models", "gpu-memory-errors"):
        assert checks[needs_a_gpu]["skipped"] and checks[needs_a_gpu]["ok"], checks[needs_a_gpu]

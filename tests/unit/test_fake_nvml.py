"""The stand-in NVML library answers the real pynvml as its config says.

Most tests run pynvml in a subprocess (LD_LIBRARY_PATH + FAKE_NVML_CONFIG), as
the agent's own tests will; two load the library in this process by full path.
"""

from __future__ import annotations

import _ctypes
import ctypes
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest
from support.fake_nvml import (
    MIB,
    NVLINK_LINKS,
    FakeGpu,
    build_lib,
    h100_sxm,
    rtx4090,
    subprocess_env,
    write_config,
)

# Runs in the subprocess: calls every function the library exports through
# pynvml and prints what came back, {"error": "<NVMLError subclass>"} for errors.
PROBE = r"""
import json
import pynvml as n

def call(f, *args, **kwargs):
    try:
        v = f(*args, **kwargs)
    except n.NVMLError as e:
        return {"error": type(e).__name__}
    if hasattr(v, "_fields_"):
        v = {k: getattr(v, k) for k, _ in v._fields_}
        v = {k: x.decode() if isinstance(x, bytes) else x for k, x in v.items()}
    return list(v) if isinstance(v, tuple) else v

def device(h):
    return {
        "index": call(n.nvmlDeviceGetIndex, h),
        "name": call(n.nvmlDeviceGetName, h),
        "uuid": call(n.nvmlDeviceGetUUID, h),
        "serial": call(n.nvmlDeviceGetSerial, h),
        "pci": call(n.nvmlDeviceGetPciInfo_v3, h),
        "memory": call(n.nvmlDeviceGetMemoryInfo, h),
        "memory_v2": call(n.nvmlDeviceGetMemoryInfo, h, version=n.nvmlMemory_v2),
        "memory_v2_bad_version": call(n.nvmlDeviceGetMemoryInfo, h, version=0x01000028),
        "bus_width": call(n.nvmlDeviceGetMemoryBusWidth, h),
        "max_clocks": [call(n.nvmlDeviceGetMaxClockInfo, h, t) for t in range(5)],
        "pcie_gen_curr": call(n.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "pcie_gen_max": call(n.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "pcie_width_curr": call(n.nvmlDeviceGetCurrPcieLinkWidth, h),
        "pcie_width_max": call(n.nvmlDeviceGetMaxPcieLinkWidth, h),
        "nvlink": [call(n.nvmlDeviceGetNvLinkState, h, link) for link in range(%(links)d + 1)],
        "cc": call(n.nvmlDeviceGetCudaComputeCapability, h),
        "mig": call(n.nvmlDeviceGetMigMode, h),
        "ecc": call(n.nvmlDeviceGetEccMode, h),
        "ecc_errors": [
            call(n.nvmlDeviceGetTotalEccErrors, h, err, counter)
            for err in (n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_MEMORY_ERROR_TYPE_CORRECTED)
            for counter in (n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC)
        ],
        "power_limit": call(n.nvmlDeviceGetPowerManagementLimit, h),
        "enforced_power_limit": call(n.nvmlDeviceGetEnforcedPowerLimit, h),
        "power_usage": call(n.nvmlDeviceGetPowerUsage, h),
        "utilization": call(n.nvmlDeviceGetUtilizationRates, h),
        "temperature": [call(n.nvmlDeviceGetTemperature, h, s) for s in (n.NVML_TEMPERATURE_GPU, 1)],
    }

out = {"init": call(n.nvmlInit)}
if out["init"] is None:
    out["driver"] = call(n.nvmlSystemGetDriverVersion)
    out["nvml_version"] = call(n.nvmlSystemGetNVMLVersion)
    out["cuda"] = call(n.nvmlSystemGetCudaDriverVersion)
    out["cuda_v2"] = call(n.nvmlSystemGetCudaDriverVersion_v2)
    out["count"] = call(n.nvmlDeviceGetCount)
    count = out["count"] if isinstance(out["count"], int) else 0
    out["handle_past_end"] = call(n.nvmlDeviceGetHandleByIndex, count)
    out["gpus"] = []
    for i in range(count):
        try:
            h = n.nvmlDeviceGetHandleByIndex(i)
        except n.NVMLError as e:
            out["gpus"].append({"handle": {"error": type(e).__name__}})
        else:
            out["gpus"].append(device(h))
    out["error_strings"] = {c: call(n.nvmlErrorString, c) for c in (3, 13, 15, 999, 4242)}
    out["shutdown"] = call(n.nvmlShutdown)
    out["after_shutdown"] = call(n.nvmlDeviceGetCount)
print(json.dumps(out))
""" % {"links": NVLINK_LINKS}  # noqa: UP031 - %-formatting leaves the probe's own braces alone

# Which exported function answers each key of the probe's per-GPU dict.
FUNCTION_OF = {
    "index": "nvmlDeviceGetIndex",
    "name": "nvmlDeviceGetName",
    "uuid": "nvmlDeviceGetUUID",
    "serial": "nvmlDeviceGetSerial",
    "pci": "nvmlDeviceGetPciInfo_v3",
    "memory": "nvmlDeviceGetMemoryInfo",
    "memory_v2": "nvmlDeviceGetMemoryInfo_v2",
    "memory_v2_bad_version": "nvmlDeviceGetMemoryInfo_v2",
    "bus_width": "nvmlDeviceGetMemoryBusWidth",
    "max_clocks": "nvmlDeviceGetMaxClockInfo",
    "pcie_gen_curr": "nvmlDeviceGetCurrPcieLinkGeneration",
    "pcie_gen_max": "nvmlDeviceGetMaxPcieLinkGeneration",
    "pcie_width_curr": "nvmlDeviceGetCurrPcieLinkWidth",
    "pcie_width_max": "nvmlDeviceGetMaxPcieLinkWidth",
    "nvlink": "nvmlDeviceGetNvLinkState",
    "cc": "nvmlDeviceGetCudaComputeCapability",
    "mig": "nvmlDeviceGetMigMode",
    "ecc": "nvmlDeviceGetEccMode",
    "ecc_errors": "nvmlDeviceGetTotalEccErrors",
    "power_limit": "nvmlDeviceGetPowerManagementLimit",
    "enforced_power_limit": "nvmlDeviceGetEnforcedPowerLimit",
    "power_usage": "nvmlDeviceGetPowerUsage",
    "utilization": "nvmlDeviceGetUtilizationRates",
    "temperature": "nvmlDeviceGetTemperature",
}

# Keys whose value is a list of calls, one per argument value (clock type, link, ...).
PROBED_PER_ARGUMENT = {"max_clocks", "nvlink", "ecc_errors", "temperature"}


def err(name: str) -> dict[str, str]:
    """What the probe prints for NVML_ERROR_<name>: the pynvml exception class."""
    return {"error": type(pynvml.NVMLError(getattr(pynvml, f"NVML_ERROR_{name}"))).__name__}


INVALID = err("INVALID_ARGUMENT")


def failure_for(symbol: str, gpu: FakeGpu, global_fail: dict[str, str]) -> str | None:
    """The configured error for `symbol`, by the library's rules (a GPU's rule wins; no _vN covers all)."""
    for rules in (gpu.fail, global_fail):
        for name in (symbol, re.sub(r"_v\d+$", "", symbol)):
            if name in rules:
                return rules[name]
    return None


def expected(g: FakeGpu, index: int, global_fail: dict[str, str] | None = None) -> dict:
    domain, bus, device = (int(x, 16) for x in re.split(r"[:.]", g.bus_id)[:3])
    values = {
        "index": index,
        "name": g.name,
        "uuid": g.uuid,
        "serial": g.serial,
        "pci": {
            "busIdLegacy": f"{domain:04X}:{bus:02X}:{device:02X}.0",
            "domain": domain,
            "bus": bus,
            "device": device,
            "pciDeviceId": g.pci_device_id,
            "pciSubSystemId": g.pci_subsystem_id,
            "busId": g.bus_id,
        },
        "memory": {
            "total": g.memory_total,
            "free": g.memory_total - g.memory_used - g.memory_reserved,
            "used": g.memory_used + g.memory_reserved,
        },
        "memory_v2": {
            "version": pynvml.nvmlMemory_v2,
            "total": g.memory_total,
            "reserved": g.memory_reserved,
            "free": g.memory_total - g.memory_used - g.memory_reserved,
            "used": g.memory_used,
        },
        "memory_v2_bad_version": err("ARGUMENT_VERSION_MISMATCH"),
        "bus_width": g.bus_width,
        "max_clocks": [g.max_graphics_clock, g.max_sm_clock, g.max_mem_clock, g.max_video_clock, INVALID],
        "pcie_gen_curr": g.pcie_gen_curr,
        "pcie_gen_max": g.pcie_gen_max,
        "pcie_width_curr": g.pcie_width_curr,
        "pcie_width_max": g.pcie_width_max,
        "nvlink": [int(link < g.nvlink_up) for link in range(NVLINK_LINKS)] + [INVALID],
        "cc": list(g.cc),
        "mig": list(g.mig),
        "ecc": list(g.ecc),
        "ecc_errors": [g.ecc_uncorrected, g.ecc_uncorrected, 0, 0],
        "power_limit": g.power_limit,
        "enforced_power_limit": g.power_limit,
        "power_usage": g.power_usage,
        "utilization": {"gpu": g.util_gpu, "memory": g.util_mem},
        "temperature": [g.temperature, INVALID],
    }
    for key, symbol in FUNCTION_OF.items():
        failure = failure_for(symbol, g, global_fail or {})
        if failure:  # a configured failure comes before any argument check
            values[key] = [err(failure)] * len(values[key]) if key in PROBED_PER_ARGUMENT else err(failure)
    return values


def run_probe(env: dict[str, str]) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def probe(config: Path) -> dict:
    return run_probe({**os.environ, **subprocess_env(config)})[0]


def assert_reports(out: dict, gpus: list[FakeGpu], *, driver="550.54.15", cuda=12040, fail=None) -> None:
    assert out["init"] is None
    assert out["driver"] == driver
    assert out["nvml_version"] == f"{cuda // 1000}.{driver}"
    assert out["count"] == len(gpus)
    assert out["handle_past_end"] == INVALID
    for i, (got, g) in enumerate(zip(out["gpus"], gpus, strict=True)):
        if failure_for("nvmlDeviceGetHandleByIndex_v2", g, fail or {}):
            continue
        assert got == expected(g, i, fail), f"GPU {i}"
    assert out["error_strings"] == {
        "3": "Not Supported",
        "13": "Function Not Found",
        "15": "GPU is lost",
        "999": "Unknown Error",
        "4242": "Unknown Error",
    }
    assert out["shutdown"] is None
    assert out["after_shutdown"] == err("UNINITIALIZED")


def test_presets_match_the_cards():
    (card,) = rtx4090()
    assert (card.name, card.memory_total, card.bus_width, card.max_mem_clock) == (
        "NVIDIA GeForce RTX 4090", 24564 * MIB, 384, 10501,
    )  # fmt: skip
    assert (card.pcie_gen_max, card.pcie_width_max, card.nvlink_up, card.cc) == (4, 16, 0, (8, 9))
    assert set(card.fail) == {
        "nvmlDeviceGetMigMode", "nvmlDeviceGetEccMode", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetNvLinkState",
    }  # fmt: skip
    assert set(card.fail.values()) == {"NOT_SUPPORTED"}

    gpus = h100_sxm()
    assert len(gpus) == 8
    for g in gpus:
        assert (g.name, g.memory_total, g.bus_width, g.max_mem_clock) == (
            "NVIDIA H100 80GB HBM3", 81559 * MIB, 5120, 2619,
        )  # fmt: skip
        assert (g.pcie_gen_max, g.pcie_width_max, g.nvlink_up, g.cc) == (5, 16, 18, (9, 0))
        assert (g.mig, g.ecc, g.ecc_uncorrected, g.power_limit, g.fail) == ((0, 0), (1, 1), 0, 700_000, {})
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", g.uuid)
    for preset in (h100_sxm(16), rtx4090(9), [FakeGpu(), FakeGpu()]):
        assert len({g.uuid for g in preset}) == len({g.bus_id for g in preset}) == len(preset)
    assert [g.uuid for g in h100_sxm(2)] == [g.uuid for g in h100_sxm(2)]  # stable across calls


def test_h100_box_reports_its_config(tmp_path):
    gpus = h100_sxm(8)
    busy = gpus[3]  # one GPU that is in use, hot, and has seen better days
    busy.memory_used, busy.memory_reserved = 40 * 1024 * MIB, 512 * MIB
    busy.util_gpu, busy.util_mem, busy.power_usage, busy.temperature = 87, 43, 612_000, 71
    busy.ecc_uncorrected, busy.mig, busy.nvlink_up = 2, (1, 1), 12
    busy.pcie_gen_curr, busy.pcie_width_curr = 1, 8
    out = probe(write_config(tmp_path / "nvml.conf", gpus, driver="535.183.01", cuda=12020))
    assert_reports(out, gpus, driver="535.183.01", cuda=12020)
    assert (out["cuda"], out["cuda_v2"]) == (12020, 12020)
    assert out["gpus"][3]["nvlink"][11:13] == [1, 0]
    assert out["gpus"][0]["pci"]["busId"] == "00000000:18:00.0"


def test_sixteen_gpus(tmp_path):
    gpus = h100_sxm(16)
    out = probe(write_config(tmp_path / "nvml.conf", gpus))
    assert_reports(out, gpus)
    assert len({g["uuid"] for g in out["gpus"]}) == 16


def test_geforce_answers_not_supported(tmp_path):
    gpus = rtx4090()
    out = probe(write_config(tmp_path / "nvml.conf", gpus))
    assert_reports(out, gpus)
    (card,) = out["gpus"]
    not_supported = err("NOT_SUPPORTED")
    assert card["mig"] == card["ecc"] == not_supported
    assert card["ecc_errors"] == [not_supported] * 4
    assert card["nvlink"] == [not_supported] * (NVLINK_LINKS + 1)
    assert card["memory"]["total"] == 24564 * MIB and card["cc"] == [8, 9]


def test_configured_failures_raise_the_matching_errors(tmp_path):
    gpus = h100_sxm(4)
    gpus[1].fail = {"nvmlDeviceGetHandleByIndex": "GPU_IS_LOST"}
    gpus[2].fail = {"nvmlDeviceGetPowerUsage": "UNKNOWN"}  # wins over the global rule
    gpus[3].fail = {"nvmlDeviceGetTemperature": "INSUFFICIENT_POWER", "nvmlDeviceGetSerial": "NO_PERMISSION"}
    fail = {
        "nvmlDeviceGetMemoryInfo_v2": "FUNCTION_NOT_FOUND",  # v1 still answers
        "nvmlDeviceGetPowerUsage": "NOT_SUPPORTED",
        "nvmlSystemGetCudaDriverVersion": "NVML_ERROR_NO_PERMISSION",  # no _vN: covers _v2 too
    }
    out = probe(write_config(tmp_path / "nvml.conf", gpus, fail=fail))
    assert_reports(out, gpus, fail=fail)
    assert out["cuda"] == out["cuda_v2"] == err("NO_PERMISSION")
    assert out["gpus"][1] == {"handle": err("GPU_IS_LOST")}
    assert out["gpus"][0]["memory_v2"] == {"error": "NVMLError_FunctionNotFound"}
    assert out["gpus"][0]["memory"]["total"] == 81559 * MIB
    assert [g.get("power_usage") for g in out["gpus"]] == [
        err("NOT_SUPPORTED"), None, err("UNKNOWN"), err("NOT_SUPPORTED"),
    ]  # fmt: skip
    assert out["gpus"][3]["temperature"] == [err("INSUFFICIENT_POWER")] * 2
    assert out["gpus"][3]["serial"] == err("NO_PERMISSION")


def test_zero_gpus(tmp_path):
    out = probe(write_config(tmp_path / "nvml.conf", []))
    assert_reports(out, [])
    assert out["gpus"] == []


def test_init_failures(tmp_path):
    env = {**os.environ, **subprocess_env(tmp_path / "nvml.conf")}

    del env["FAKE_NVML_CONFIG"]  # as on a host without the NVIDIA driver
    assert run_probe(env)[0] == {"init": err("DRIVER_NOT_LOADED")}

    write_config(tmp_path / "nvml.conf", h100_sxm(1), fail={"nvmlInit": "LIB_RM_VERSION_MISMATCH"})
    assert probe(tmp_path / "nvml.conf") == {"init": err("LIB_RM_VERSION_MISMATCH")}

    (tmp_path / "nvml.conf").write_text("gpus 2\n# a comment\ngpu 1 colour blue\n")
    out, stderr = run_probe({**os.environ, **subprocess_env(tmp_path / "nvml.conf")})
    assert out == {"init": err("UNKNOWN")}
    assert stderr == f"fake-nvml: {tmp_path / 'nvml.conf'}:3: gpu 1: unknown key 'colour'\n"

    out, stderr = run_probe({**os.environ, **subprocess_env(tmp_path / "missing.conf")})
    assert out == {"init": err("UNKNOWN")}
    assert "missing.conf: cannot open: No such file or directory" in stderr


# ---- in this process: preloaded by full path -------------------------------------------


@pytest.fixture
def preloaded_nvml(monkeypatch):
    """The fake library loaded by full path, so pynvml's CDLL("libnvidia-ml.so.1") gets it.

    Afterwards pynvml forgets it and it is unloaded, so later tests in this
    process find no NVML, as before.
    """
    if pynvml.nvmlLib is not None:
        pytest.skip("pynvml has already loaded an NVML library in this process")
    path = build_lib()
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    lib.fakeNvmlConfigPath.restype = ctypes.c_char_p
    monkeypatch.delenv("FAKE_NVML_CONFIG", raising=False)
    try:
        yield lib
    finally:
        bound = pynvml.nvmlLib
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
        for loaded in (bound, lib):  # one dlclose per dlopen
            if loaded is not None:
                _ctypes.dlclose(loaded._handle)
        assert str(path) not in Path("/proc/self/maps").read_text()


def test_preloaded_library_rereads_its_config_on_each_init(preloaded_nvml, tmp_path, monkeypatch):
    config = write_config(tmp_path / "nvml.conf", h100_sxm(2))
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(config))
    pynvml.nvmlInit()
    assert preloaded_nvml.fakeNvmlConfigPath() == str(config).encode()  # the fake, not a real NVML
    assert pynvml.nvmlDeviceGetCount() == 2
    assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(1)) == "NVIDIA H100 80GB HBM3"

    pynvml.nvmlInit()  # init is reference counted
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 2
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()

    write_config(config, rtx4090(), driver="560.35.03", cuda=12060)
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetCount() == 1
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA GeForce RTX 4090"
        assert pynvml.nvmlSystemGetDriverVersion() == "560.35.03"
        assert pynvml.nvmlSystemGetCudaDriverVersion() == 12060
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetMigMode(handle)
    finally:
        pynvml.nvmlShutdown()


def test_preloaded_library_knows_every_pynvml_error(preloaded_nvml, tmp_path, monkeypatch):
    config = tmp_path / "nvml.conf"
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(config))
    names = sorted(n.removeprefix("NVML_ERROR_") for n in dir(pynvml) if n.startswith("NVML_ERROR_"))
    assert "FUNCTION_NOT_FOUND" in names and "UNKNOWN" in names
    for name in names:
        write_config(config, h100_sxm(1), fail={"nvmlSystemGetDriverVersion": name})
        pynvml.nvmlInit()
        try:
            with pytest.raises(pynvml.nvmlExceptionClass(getattr(pynvml, f"NVML_ERROR_{name}"))):
                pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()

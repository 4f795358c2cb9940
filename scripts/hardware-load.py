"""The agent's NVML code on a real driver, idle and under load.

What the stand-in NVML of the tests cannot show: what a real driver answers
and what it costs. Prints, as tables:

1. the cost of one inventory (NVML opened afresh, as at start-up) and of one
   heartbeat's telemetry (NVML kept open, as the daemon does), against the
   real alternative a host would otherwise script, `nvidia-smi --query-gpu`;
2. which fault events the driver lets the agent watch (Xid, ECC, unavailable);
3. the heartbeat's per-GPU figures sampled while a PyTorch matrix product
   loads GPU 0, beside what nvidia-smi reports at the same moment.

    python3 scripts/hardware-load.py [--load-seconds 12]

Needs the agent importable (scripts/hardware-check.sh installs it from .whl)
and, for part 3, PyTorch with CUDA; without it, part 3 is skipped.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import pynvml

from gpuhost_agent.inventory.gpu_events import UNAVAILABLE, WATCHED, fault_of
from gpuhost_agent.inventory.nvml_probe import NvmlProbe

SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=uuid,utilization.gpu,memory.used,temperature.gpu,power.draw",
    "--format=csv,noheader,nounits",
]
LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


def costs(runs: int) -> None:
    cold = []
    for _ in range(5):
        started = time.perf_counter()
        probe = NvmlProbe()
        probe.inventory()
        cold.append(time.perf_counter() - started)
        probe.close()
    probe = NvmlProbe()
    probe.telemetry()
    warm = []
    for _ in range(runs):
        started = time.perf_counter()
        probe.telemetry()
        warm.append(time.perf_counter() - started)
    probe.close()
    smi = []
    for _ in range(10):
        started = time.perf_counter()
        subprocess.run(SMI_QUERY, check=True, capture_output=True)
        smi.append(time.perf_counter() - started)
    print("| what | median | max | runs |\n| --- | --- | --- | --- |")
    print(f"| inventory, NVML opened afresh | {_ms(statistics.median(cold))} | {_ms(max(cold))} | {len(cold)} |")
    print(f"| heartbeat telemetry, NVML open | {_ms(statistics.median(warm))} | {_ms(max(warm))} | {len(warm)} |")
    print(f"| `nvidia-smi --query-gpu` (same figures) | {_ms(statistics.median(smi))} | {_ms(max(smi))} | {len(smi)} |")
    print(f"\nratio nvidia-smi / telemetry: {statistics.median(smi) / statistics.median(warm):.0f}x")


def events() -> None:
    pynvml.nvmlInit()
    try:
        names = {pynvml.nvmlEventTypeXidCriticalError: "Xid", pynvml.nvmlEventTypeDoubleBitEccError: "double-bit ECC"}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
            except pynvml.NVMLError as exc:
                print(f"GPU {index}: supported event types not readable: {exc}")
                continue
            watched = [name for bit, name in names.items() if supported & bit]
            print(f"GPU {index}: supported event mask {supported:#x}; watched here: {watched or 'none'}", end="")
            print(", GPU unavailable" if supported & UNAVAILABLE else "")
            event_set = pynvml.nvmlEventSetCreate()
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, supported & WATCHED, event_set)
                try:
                    data = pynvml.nvmlEventSetWait_v2(event_set, 200)
                    reason = fault_of(int(data.eventType), int(data.eventData))
                    print(f"  an event already waiting: {int(data.eventType):#x} -> {reason}")
                except pynvml.NVMLError_Timeout:
                    print("  registered; no event in 200 ms (as expected on a healthy GPU)")
            finally:
                pynvml.nvmlEventSetFree(event_set)
    finally:
        pynvml.nvmlShutdown()


def under_load(seconds: float) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("no PyTorch here: no load to sample")
        return
    probe = NvmlProbe()
    agent = "agent util % | agent mem used GiB | agent temp C | agent power W"
    print(f"| t (s) | {agent} | nvidia-smi util, mem MiB, temp, power |")
    print("| --- | --- | --- | --- | --- | --- |")
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(seconds)])
    started = time.monotonic()
    try:
        while load.poll() is None or time.monotonic() - started < seconds + 3:
            beat = probe.telemetry()[0]
            smi = subprocess.run(SMI_QUERY, capture_output=True, text=True).stdout.splitlines()[0].split(", ")[1:]
            used = beat["memoryUsedBytes"] / 2**30 if beat["memoryUsedBytes"] is not None else float("nan")
            print(
                f"| {time.monotonic() - started:5.1f} | {beat['utilizationPercent']} | {used:.2f} "
                f"| {beat['temperatureC']} | {beat['powerW']} | {', '.join(smi)} |"
            )
            time.sleep(1)
    finally:
        load.kill()
        probe.close()
    print(f"load exit status: {load.wait()}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--load-seconds", type=float, default=12)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    print("## Cost of the agent's NVML reads\n")
    costs(args.runs)
    print("\n## Fault events\n")
    events()
    print("\n## Heartbeat figures under load (PyTorch bf16 8192x8192 products on GPU 0)\n")
    under_load(args.load_seconds)


if __name__ == "__main__":
    main()

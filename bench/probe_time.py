"""How long does a full machine probe take on an 8-GPU box, and how much memory?

The agent probes at start-up, on its systemData schedule and whenever
`gpuhost-agent probe` or `doctor` runs; the target is under 200 ms for an 8-GPU
machine, network speed test excluded. The GPUs are the stand-in NVML library
(tests/fake_nvml) configured as an 8-GPU H100 SXM board, so the NVML figures are
the cost of our code and pynvml's ctypes calls, not of a real driver; the host
part is real: the Docker Engine's info, `docker compose version`, the toolkit
lookup, psutil and /proc.

Each run is a cold probe (NVML initialised afresh, as at start-up) followed by
warm ones (NVML kept open, as the daemon does). Memory: the peak of Python
allocations during one probe (tracemalloc) and the process's peak RSS.

    .venv/bin/python bench/probe_time.py [--runs N] [--gpus N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.fake_nvml import build_lib, h100_sxm, write_config  # noqa: E402

from gpuhost_agent.inventory.nvml_probe import NvmlProbe  # noqa: E402
from gpuhost_agent.inventory.system_data import Prober, build_report  # noqa: E402
from gpuhost_agent.protocol.requirements import Requirements  # noqa: E402
from gpuhost_agent.runtime.compose import find_compose_command  # noqa: E402
from gpuhost_agent.runtime.engine.client import DockerEngine  # noqa: E402


async def one_probe(prober: Prober) -> tuple[float, dict]:
    started = time.perf_counter()
    report = build_report(await prober.system_data(), Requirements(), None)
    return (time.perf_counter() - started) * 1000, report


def nvml_only(probe: NvmlProbe, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        probe.inventory()
        times.append((time.perf_counter() - started) * 1000)
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()

    config = write_config(Path(os.environ.get("TMPDIR", "/tmp")) / "gpuhost-bench-nvml.conf", h100_sxm(args.gpus))
    os.environ["FAKE_NVML_CONFIG"] = str(config)
    engine = DockerEngine()
    prober = Prober(NvmlProbe(str(build_lib())), engine, find_compose_command())

    cold_ms, report = await one_probe(prober)
    assert report["listing"]["totalGPUs"] == args.gpus, report["listing"]
    warm = [(await one_probe(prober))[0] for _ in range(args.runs)]
    nvml_ms = nvml_only(prober.nvml, args.runs)
    tracemalloc.start()
    await one_probe(prober)
    _, peak_alloc = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    prober.nvml.close()
    await engine.close()

    warm.sort()
    rows = [
        ("cold probe (NVML init included)", f"{cold_ms:.1f} ms"),
        (f"warm probe p50 of {args.runs}", f"{statistics.median(warm):.1f} ms"),
        (f"warm probe max of {args.runs}", f"{warm[-1]:.1f} ms"),
        (f"  of which NVML, {args.gpus} GPUs, p50", f"{statistics.median(nvml_ms):.2f} ms"),
        ("peak Python allocations, one probe", f"{peak_alloc / 1024:.0f} KiB"),
        ("peak RSS of this process", f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB"),
        ("target", "< 200 ms"),
    ]
    print(
        f"full probe, {args.gpus}-GPU stand-in machine, network test excluded "
        f"({platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs)"
    )
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    asyncio.run(main())

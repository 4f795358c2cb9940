"""What the host's limits per rental cost: the rental's cgroup on a
deploy, and the disk watch at rest.

Deploy: the same one-service Compose file brought up with `docker compose up
-d` by the real Compose binary, alternately without a `cgroup_parent` and
with the rental's (the agent's RentalCgroups making and limiting it first, as
a deploy does), each followed by `down`; the ratio of medians is what a
rental's cgroup adds to Compose's own deploy. Disk watch: the wall time of one
measurement (`GET /system/df` and the sums) with the stacks this engine has,
and what that costs a core at the default 60 s interval.

    .venv/bin/python bench/host_limits.py [--pairs 10]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuhost_agent.core.disk_watch import usage_by_rental
from gpuhost_agent.runtime.compose import find_compose_command
from gpuhost_agent.runtime.engine.client import DockerEngine
from gpuhost_agent.runtime.rental_cgroups import RentalCgroups, RentalLimits

IMAGE = "gpuhost-test/busybox:1"
LIMITS = RentalLimits(memory_bytes=2 * 1024**3, cpus=2.0, pids=4096)


def compose_file(parent: str | None) -> str:
    extra = f"\n    cgroup_parent: {parent}" if parent else ""
    return f"services:\n  app:\n    image: {IMAGE}\n    command: ['sleep', '3600']\n    stop_signal: SIGKILL{extra}\n"


def deploy_once(compose: list[str], folder: Path, parent: str | None, cgroups: RentalCgroups | None) -> float:
    (folder / "compose.yaml").write_text(compose_file(parent))
    started = time.perf_counter()
    if parent and cgroups is not None:
        cgroups.apply(parent.rsplit("r-", 1)[-1], LIMITS)
    subprocess.run(
        [*compose, "-p", "bench-limits", "up", "-d", "--quiet-pull"], cwd=folder, check=True, capture_output=True
    )
    took = time.perf_counter() - started
    subprocess.run([*compose, "-p", "bench-limits", "down", "-t", "0"], cwd=folder, check=True, capture_output=True)
    return took


async def disk_watch_once(engine: DockerEngine) -> float:
    started = time.perf_counter()
    usage_by_rental(await engine.disk_usage(), {})
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    args = parser.parse_args()
    compose = find_compose_command()
    info = subprocess.run(
        ["docker", "info", "--format", "{{.CgroupDriver}} {{.CgroupVersion}}"], capture_output=True, text=True
    )
    driver, version = (info.stdout.split() + ["", ""])[:2]
    cgroups = RentalCgroups()
    why_not = cgroups.configure(driver, version)
    if why_not:
        sys.exit(f"rental cgroups are not available here: {why_not}")
    plain, limited = [], []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.pairs):
            plain.append(deploy_once(compose, Path(folder), None, None))
            limited.append(deploy_once(compose, Path(folder), "/gpuhost-agent/r-bench", cgroups))
    cgroups.remove("bench")
    engine = DockerEngine()
    watch = [asyncio.run(disk_watch_once(engine)) for _ in range(5)]
    engine.close()
    where = f"{platform.node()}, {driver} cgroup v{version}, Python {platform.python_version()}"
    print(f"\nhost limits, {args.pairs} pairs; {where}")
    print(f"{'':34} | {'median':>8} | {'p90':>8}")
    for label, times in (("compose up, no cgroup parent", plain), ("compose up, the rental's cgroup", limited)):
        p90 = statistics.quantiles(times, n=10)[-1] if len(times) > 1 else times[0]
        print(f"{label:34} | {statistics.median(times) * 1000:7.0f}ms | {p90 * 1000:7.0f}ms")
    print(f"ratio of medians (with / without): {statistics.median(limited) / statistics.median(plain):.2f}")
    median = statistics.median(watch)
    print(
        f"disk watch, one measurement: {median * 1000:.0f} ms; at the 60 s interval {median / 60 * 100:.3f} % of a core"
    )


if __name__ == "__main__":
    main()

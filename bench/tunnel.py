"""What does a tunnel cost, against the same service reached directly?

Deploys one stack through the local marketplace (in this process, over HTTP on
loopback): nginx serving a file of --mb MiB and a tiny page, on a port
published on 127.0.0.1 (the direct path) and reached through its tunnel
(client -> marketplace listener -> stream WebSocket -> agent -> container).
The agent runs as its own `gpuhost-agent run` process (--agent separate, the
default: marketplace and agent are different machines in production) or on
this process's event loop beside the marketplace (--agent in-process). In the
same run, alternating:

- throughput: one download of the big file with curl, direct and tunnel, --runs
  times each (MB/s; the ratio is tunnel / direct, goal >= 0.8);
- connection + request latency: --requests sequential GETs of the tiny page
  with curl, each on a new connection (through a tunnel, a new stream through
  the agent's channel); p50 and p99 for both paths and the difference;
- keep-alive: wrk with --connections connections for --wrk-seconds, --runs
  times a path: requests a second and latency p50/p99 (bench/keepalive.py;
  goal under 2 ms added at p50);
- held connections: --hold clients connected through the tunnel at once, each
  with half a request sent, and new requests' latency while they are held
  (bench/held_connections.py);
- SSH (the stack has isSSHEnabled): `ssh host true` against `docker exec
  <container> true`, --ssh-runs times each (the whole client run: handshake,
  key check against the marketplace, exec), and the big file copied out with
  `scp` against `docker cp`, --runs times each;
- terminal echo: a keystroke's round trip in a terminal (`cat` on a TTY),
  --echoes times idle and again while curl downloads the big file through the
  tunnel in a loop (bench/terminal_echo.py; goal p99 < 50 ms during it).

    bash scripts/build-bench-images.sh   # wrk and the nginx image (make bench runs it)
    .venv/bin/python bench/tunnel.py [--mb 200] [--runs 3] [--requests 200] [--ssh-runs 20] [--hold 1000]
                                     [--echoes 200] [--connections 50] [--wrk-seconds 10]
                                     [--agent separate|in-process]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import agent_runner  # noqa: E402 - bench/ is on the path when run as a script
import aiohttp
import held_connections  # noqa: E402
import keepalive  # noqa: E402
import python_floor  # noqa: E402
import ssh_bench  # noqa: E402
import terminal_echo  # noqa: E402
from pickup_latency import local_config, pct, wait_until  # noqa: E402

from gpuhost_agent.common import logs
from gpuhost_agent.protocol import wire
from gpuhost_agent.service.wiring import start_local_marketplace

IMAGE = "gpuhost-test/nginx:1"  # scripts/build-bench-images.sh


def compose(mb: int) -> str:
    start = (
        f"mkdir -p /www && dd if=/dev/zero of=/www/big bs=1M count={mb} 2>/dev/null"
        " && echo ok > /www/small && exec nginx"
    )
    return (
        f"services:\n  web:\n    image: {IMAGE}\n    command: ['sh', '-c', '{start}']\n"
        f"    ports: ['127.0.0.1::8080']\n    stop_grace_period: 1s\n"
    )


def curl_seconds(url: str, what: str) -> float:
    """Wall time of one curl (`what`: %{time_total} or %{speed_download})."""
    done = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "--max-time", "300", "-w", what, url],
        capture_output=True,
        text=True,
        check=True,
        timeout=320,
    )
    return float(done.stdout)


async def deploy(http: aiohttp.ClientSession, store, mb: int) -> tuple[str, str, str]:
    """(direct URL, tunnel URL, stack id) of the stack's web service, once both answer."""
    async with http.post("rentals", json={"envId": store.envId, "name": "bench", "gpuCount": 0}) as resp:
        rental_id = (await resp.json())["rentalId"]
    template = {
        "name": "tunnel-bench",
        "description": "bench",
        "content": compose(mb),
        "environmentVariables": {},
        "isSSHEnabled": True,
    }
    async with http.post(f"rentals/{rental_id}/stacks", json={"template": template}) as resp:
        stack_id = await resp.json()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        async with http.get(f"rentals/{rental_id}/stacks") as resp:
            stack = next(s for s in await resp.json() if s["stackId"] == stack_id)
        containers = (store.containers.get(stack_id) or {}).get("containers") or []
        ports = [p for c in containers for p in c.get("Ports", []) if p.get("PublicPort")]
        web = [t for t in stack["tunnels"] if t["protocol"] == "http"]
        if stack["status"] == wire.APPLIED and web and ports:
            direct = f"http://127.0.0.1:{ports[0]['PublicPort']}/"
            tunnel = web[0]["url"]
            if await asyncio.to_thread(_answers, direct) and await asyncio.to_thread(_answers, tunnel):
                return direct, tunnel, stack_id
        await asyncio.sleep(0.2)
    raise TimeoutError("the stack and its tunnel did not come up")


async def end_rental(http: aiohttp.ClientSession, store, stack_id: str) -> None:
    """The bench's rental ended and its stack gone before the agent stops: a
    bench that stopped the agent first left its container behind, stopped,
    on every run."""
    async with http.delete(f"rentals/{store.stacks[stack_id]['rentalId']}") as resp:
        resp.raise_for_status()
    await wait_until(lambda: stack_id not in store.stacks, 60, "the bench's stack to be removed")


def remove_leftovers(env_id: str) -> None:
    """A run that failed before its rental ended leaves its stack behind: its
    containers and networks go by the agent's environment label, as the tests'
    clean-up does, so the next run starts from an empty engine."""

    def docker(*args: str) -> list[str]:
        return subprocess.run(["docker", *args], capture_output=True, text=True, check=False).stdout.split()

    label = f"label={wire.LABEL_ENV}={env_id}"
    projects = set(docker("ps", "-a", "--filter", label, "--format", '{{.Label "com.docker.compose.project"}}'))
    if containers := docker("ps", "-aq", "--filter", label):
        docker("rm", "-f", "-v", *containers)
    for project in projects:
        if networks := docker("network", "ls", "-q", "--filter", f"label=com.docker.compose.project={project}"):
            docker("network", "rm", *networks)
    if containers:
        print(f"removed what the failed run left: {len(containers)} container(s), projects {sorted(projects)}")


def service_address(container_id: str) -> str:
    """host:port of the web service on the container's own address: the last
    hop the agent dials, where the published port goes through docker-proxy."""
    done = subprocess.run(
        ["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", container_id],
        capture_output=True,
        text=True,
        check=True,
    )
    return f"{done.stdout.split()[0]}:8080"


def _answers(url: str) -> bool:
    try:
        return curl_seconds(url + "small", "%{http_code}") == 200
    except subprocess.CalledProcessError:
        return False


async def bench(args: argparse.Namespace, workdir: Path) -> None:
    keepalive.have_wrk()
    held_connections.enough_descriptors(args.hold)
    config = local_config(workdir, settle_seconds=1.0, stop_timeout=1)
    local = await start_local_marketplace(config)
    store = local.state.store
    if args.agent == "separate":
        agent: agent_runner.SeparateAgent | agent_runner.InProcessAgent = agent_runner.SeparateAgent(
            config, local, workdir
        )
    else:
        agent = agent_runner.InProcessAgent(config, local)
    floor: python_floor.Floor | None = None
    ended = False
    try:
        await agent.start()
        headers = {wire.API_KEY_HEADER: store.renterApiKey}
        async with aiohttp.ClientSession(local.base_url + "/", headers=headers) as http:
            key = await asyncio.to_thread(ssh_bench.make_key, workdir)
            async with http.post("users/ssh-key", json={"publicKey": key[1]}) as resp:
                resp.raise_for_status()
            direct, tunnel, stack_id = await deploy(http, store, args.mb)
            ssh = await ssh_bench.endpoint(http, store, stack_id, workdir, key[0])
        floor = python_floor.Floor(await asyncio.to_thread(service_address, ssh.container_id))
        paths = {"direct": direct, "floor": floor.start(), "tunnel": tunnel}
        speeds: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.runs):
            for name, url in paths.items():
                speeds[name].append(await asyncio.to_thread(curl_seconds, url + "big", "%{speed_download}") / 1e6)
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.requests):
            for name, url in paths.items():
                times[name].append(await asyncio.to_thread(curl_seconds, url + "small", "%{time_total}") * 1000)
        small = {name: url + "small" for name, url in paths.items()}
        kept = await asyncio.to_thread(keepalive.measure, small, args.connections, args.wrk_seconds, args.runs)
        ssh_rows = await asyncio.to_thread(ssh_bench.measure, ssh, args.ssh_runs, args.runs, workdir)
        held_row = await held_rows(tunnel, args, agent.pids)
        async with aiohttp.ClientSession(local.base_url + "/", headers=headers) as http:
            echo_row = await terminal_echo.measure(
                http, store, store.stacks[stack_id]["rentalId"], stack_id, tunnel + "big", args.echoes
            )
            await end_rental(http, store, stack_id)
            ended = True
    finally:
        if floor is not None:
            floor.stop()
        await agent.stop()
        await local.stop()
        if not ended:
            await asyncio.to_thread(remove_leftovers, store.envId)
    where = "the agent in its own process" if args.agent == "separate" else "agent and marketplace in one process"
    print(f"\n({where})")
    mbs = {name: statistics.median(values) for name, values in speeds.items()}
    print(f"\ntunnel vs direct, {args.mb} MiB download x{args.runs}, {args.requests} requests (new connection each)")
    print("(floor: two bare Python relays in their own processes, to the container's address as the agent dials it:")
    print(" bench/python_floor.py; direct is the published port, through docker-proxy)")
    print(f"{'path':8} {'MB/s (median)':>14} {'req p50 ms':>11} {'req p99 ms':>11}")
    for name, speed in mbs.items():
        print(f"{name:8} {speed:14.1f} {pct(times[name], 0.5):11.2f} {pct(times[name], 0.99):11.2f}")
    print(f"throughput ratio tunnel/direct: {mbs['tunnel'] / mbs['direct']:.2f} (goal >= 0.8);", end=" ")
    print(f"floor/direct {mbs['floor'] / mbs['direct']:.2f}; tunnel/floor {mbs['tunnel'] / mbs['floor']:.2f}")
    added_p50 = pct(times["tunnel"], 0.5) - pct(times["direct"], 0.5)
    added_p99 = pct(times["tunnel"], 0.99) - pct(times["direct"], 0.99)
    print(f"added per new connection: p50 {added_p50:.2f} ms, p99 {added_p99:.2f} ms")
    keepalive.report(kept, args.connections, args.wrk_seconds)
    ssh_bench.report(ssh_rows, args.mb)
    idle, busy, downloads = echo_row
    print(f"\nterminal echo, {args.echoes} keystrokes: idle p50 {pct(idle, 0.5):.2f} ms, p99 {pct(idle, 0.99):.2f} ms;")
    print(f"during a {args.mb} MiB download loop through the tunnel ({downloads} done):", end=" ")
    print(f"p50 {pct(busy, 0.5):.2f} ms, p99 {pct(busy, 0.99):.2f} ms (goal p99 < 50 ms)")
    count, opened, held, rss_before, rss_held, before, during, answered = held_row
    print(f"\n{count} connections held through one tunnel: opened in {opened:.1f} s, {held} still held after the 5 s")
    print(f"head timeout; resident memory {rss_before:.0f} -> {rss_held:.0f} MiB (marketplace and agent together)")
    print(f"new request while held: p50 {pct(during, 0.5):.2f} ms, p99 {pct(during, 0.99):.2f} ms;", end=" ")
    print(f"{answered} of 20 answered 200")
    print(f"(before: p50 {pct(before, 0.5):.2f} ms, p99 {pct(before, 0.99):.2f} ms)")


async def held_rows(tunnel: str, args: argparse.Namespace, pids: list[int]) -> tuple:
    """The held-connections row: (count, seconds to open, held, RSS before, RSS held, latencies before,
    during, how many of 20 new requests got 200 while held)."""
    host, port = tunnel.split("//")[1].rstrip("/").split(":")
    small = tunnel + "small"
    before = [await asyncio.to_thread(curl_seconds, small, "%{time_total}") * 1000 for _ in range(20)]
    assert await asyncio.to_thread(_answers, tunnel)
    rss_before = agent_runner.rss_mib(pids)
    pairs, opened, held = await held_connections.hold(host, int(port), args.hold)
    try:
        rss_held = agent_runner.rss_mib(pids)
        during = [await asyncio.to_thread(curl_seconds, small, "%{time_total}") * 1000 for _ in range(20)]
        answered = sum([await asyncio.to_thread(_answers, tunnel) for _ in range(20)])
    finally:
        await held_connections.release(pairs)
    return args.hold, opened, held, rss_before, rss_held, before, during, answered


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--ssh-runs", type=int, default=20)
    parser.add_argument("--hold", type=int, default=1000)
    parser.add_argument("--echoes", type=int, default=200)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--wrk-seconds", type=int, default=10)
    parser.add_argument("--agent", choices=("separate", "in-process"), default="separate")
    args = parser.parse_args()
    logs.configure("warning")
    with tempfile.TemporaryDirectory(prefix="gpuhost-tunnelbench-") as tmp:
        asyncio.run(bench(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

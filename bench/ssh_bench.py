"""The SSH rows of bench/tunnel.py: the agent's SSH server against `docker exec`
and `docker cp` on the same container, in the same run.

`ssh host true` is a whole client run (TCP to the marketplace's listener, the
stream through the agent's channel, the SSH handshake, the key check against
the marketplace, a Docker exec); `docker exec <c> true` is the engine alone.
The copy is the stack's big file out of the container: `scp` (SFTP through
the file helper in the container) against `docker cp` (the engine's archive).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncssh_floor  # noqa: E402 - bench/ is on the path when run as a script
from pickup_latency import pct  # noqa: E402 - bench/ is on the path when run as a script

KEY_FILE = "bench_key"  # in the bench's work folder, made by make_key
# Every client run: no user config, only the bench's key, never a prompt.
CLIENT_OPTIONS = ["-F", "/dev/null", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes"]


@dataclass
class SshTarget:
    port: int
    user: str
    container_id: str
    options: list[str]


def make_key(workdir: Path) -> tuple[Path, str]:
    path = workdir / KEY_FILE
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path, path.with_suffix(".pub").read_text().strip()


async def endpoint(http: aiohttp.ClientSession, store, stack_id: str, workdir: Path, key: Path) -> SshTarget:
    """The stack's SSH endpoint from its tunnel info, its host key pinned."""
    stack = store.stacks[stack_id]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        async with http.get(f"rentals/{stack['rentalId']}/stacks") as resp:
            listed = next(s for s in await resp.json() if s["stackId"] == stack_id)
        found = [t for t in listed["tunnels"] if t["protocol"] == "ssh" and t["ssh"]["hostKey"]]
        if found:
            info = found[0]["ssh"]
            known = workdir / "known_hosts"
            known.write_text(f"[{info['host']}]:{info['port']} {info['hostKey']}\n")
            options = [*CLIENT_OPTIONS, "-i", str(key)]
            options += ["-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes"]
            return SshTarget(info["port"], info["user"], found[0]["containerId"], options)
        await asyncio.sleep(0.2)
    raise TimeoutError("the stack's SSH endpoint did not come up")


# The bare server's host key is made at its start: nothing to pin.
FLOOR_OPTIONS = [*CLIENT_OPTIONS, "-o", "LogLevel=ERROR", "-o", "StrictHostKeyChecking=no"]
FLOOR_OPTIONS += ["-o", "UserKnownHostsFile=/dev/null"]


def _timed(command: list[str]) -> float:
    """Milliseconds of one run of `command`, which must succeed."""
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return (time.perf_counter() - started) * 1000


def measure(target: SshTarget, runs: int, copies: int, workdir: Path) -> dict[str, list[float]]:
    """Alternating runs of each pair, so both see the same machine; the copy
    also from a bare asyncssh server (bench/asyncssh_floor.py) serving the
    same file, asyncssh's floor."""
    ssh = ["ssh", *target.options, "-p", str(target.port), f"{target.user}@127.0.0.1"]
    rows: dict[str, list[float]] = {
        "ssh true": [],
        "docker exec true": [],
        "scp out": [],
        "docker cp out": [],
        "scp out, asyncssh": [],
    }
    for _ in range(runs):
        rows["ssh true"].append(_timed([*ssh, "true"]))
        rows["docker exec true"].append(_timed(["docker", "exec", target.container_id, "true"]))
    served = workdir / "asyncssh-floor"
    served.mkdir(exist_ok=True)
    subprocess.run(["docker", "cp", f"{target.container_id}:/www/big", str(served)], check=True)
    key = workdir / KEY_FILE
    floor = asyncssh_floor.Floor(served, key.with_suffix(".pub"))
    floor_scp = ["scp", *FLOOR_OPTIONS, "-i", str(key), "-P", str(floor.start())]
    floor_scp.append("bench@127.0.0.1:/big")
    try:
        for _ in range(copies):
            scp = ["scp", *target.options, "-P", str(target.port), f"{target.user}@127.0.0.1:/www/big"]
            rows["scp out"].append(_timed([*scp, str(workdir / "scp.bin")]))
            rows["docker cp out"].append(_timed(["docker", "cp", f"{target.container_id}:/www/big", str(workdir)]))
            rows["scp out, asyncssh"].append(_timed([*floor_scp, str(workdir / "floor.bin")]))
    finally:
        floor.stop()
    return rows


def report(rows: dict[str, list[float]], mb: int) -> None:
    print(f"\nSSH through the agent vs the engine directly ({len(rows['ssh true'])} runs; copy of {mb} MiB)")
    print(f"{'what':18} {'p50 ms':>9} {'p99 ms':>9} {'MB/s (median)':>14}")
    for name, values in rows.items():
        speed = f"{mb * 1.048576 / (statistics.median(values) / 1000):14.1f}" if "out" in name else f"{'':14}"
        print(f"{name:18} {pct(values, 0.5):9.1f} {pct(values, 0.99):9.1f} {speed}")
    ratio = statistics.median(rows["docker cp out"]) / statistics.median(rows["scp out"])
    floor = statistics.median(rows["docker cp out"]) / statistics.median(rows["scp out, asyncssh"])
    through = statistics.median(rows["scp out, asyncssh"]) / statistics.median(rows["scp out"])
    print(
        f"ssh true / docker exec true at p50: {pct(rows['ssh true'], 0.5) / pct(rows['docker exec true'], 0.5):.1f}x;"
        f" scp / docker cp throughput: {ratio:.2f}"
    )
    print(f"bare asyncssh / docker cp: {floor:.2f} (asyncssh's floor);", end=" ")
    print(f"scp through the agent / bare asyncssh: {through:.2f}")

"""What the pull guard (streams/pull_guard.py) costs a pull: curl downloading
one blob from a registry stand-in on 127.0.0.1, directly and through the
guard's CONNECT tunnel (as dockerd's HTTPS pulls go), in the same run.

    .venv/bin/python bench/pull_guard.py [--mib 512] [--rounds 3]

Prints each way's best throughput and the guard's ratio to the direct one.
The guard runs in a process of its own, as in the agent; the blob's server in
another; curl writes to /dev/null. Nothing leaves this machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
SERVE = r"""
import asyncio, sys
size = int(sys.argv[1])
CHUNK = b"x" * (1 << 20)
async def blob(reader, writer):
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
    left = size
    while left:
        writer.write(CHUNK[: min(left, len(CHUNK))])
        left -= min(left, len(CHUNK))
        await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_server(blob, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""
GUARD = r"""
import asyncio, sys
from gpuhost_agent.core.sandbox.host_network import allows
from gpuhost_agent.streams.pull_guard import PullGuard
from gpuhost_agent.streams.tunnel import read_host_networks
async def main():
    async def networks():
        return await asyncio.to_thread(read_host_networks)
    guard = PullGuard(allows([f"127.0.0.1:{sys.argv[1]}"]), networks)
    server = await guard.serve("127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def _start(program: str, *args: str) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    process = subprocess.Popen([sys.executable, "-c", program, *args], stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    return process, int(process.stdout.readline())


def _download(url: str, proxy: str | None) -> float:
    """Seconds curl takes to fetch `url` to /dev/null."""
    via = ["-p", "-x", proxy] if proxy else []
    began = time.perf_counter()
    subprocess.run(["curl", "-sS", "-o", "/dev/null", *via, url], check=True, env={"PATH": os.environ["PATH"]})
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    size = args.mib << 20
    blob, blob_port = _start(SERVE, str(size))
    guard, guard_port = _start(GUARD, str(blob_port))
    try:
        url = f"http://127.0.0.1:{blob_port}/v2/x/blobs/sha256:0"
        direct = min(_download(url, None) for _ in range(args.rounds))
        guarded = min(_download(url, f"http://127.0.0.1:{guard_port}") for _ in range(args.rounds))
    finally:
        for process in (blob, guard):
            process.terminate()
    rate = args.mib / direct, args.mib / guarded
    print(f"pull guard: one {args.mib} MiB blob, best of {args.rounds}, curl to /dev/null")
    print(f"{'way':<24}{'seconds':>10}{'MiB/s':>10}")
    print(f"{'direct':<24}{direct:>10.2f}{rate[0]:>10.0f}")
    print(f"{'through the guard':<24}{guarded:>10.2f}{rate[1]:>10.0f}")
    print(f"guard / direct throughput: {rate[1] / rate[0]:.2f}")


if __name__ == "__main__":
    main()

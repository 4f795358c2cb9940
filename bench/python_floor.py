"""Python's floor on this machine, the reference row of bench/tunnel.py.

A tunnel's bytes go through two Python processes (the marketplace's listener,
the agent) before they reach the service. How fast can two Python processes
relay at all on this machine, doing nothing else? Two bare asyncio relays,
each its own process, chained: client -> relay 1 -> relay 2 -> the service on
the container's own address, the hop the agent dials (the direct path's
published port goes through docker-proxy, a third process). No WebSocket, no framing, no admission: plain
`StreamReader.read(256 KiB)` and `write` both ways, as the tunnel's hops do.
Whatever the tunnel loses beyond this row is ours (framing, masking, the
stream's set-up); what this row loses against the direct path is the floor
of two Python relays on two cores shared with the client and the service.

    .venv/bin/python bench/python_floor.py --to 127.0.0.1:PORT   # prints its port, relays until killed
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys

CHUNK = 256 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _relay(host: str, port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port, limit=CHUNK)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        for each in (writer, up_writer):
            each.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=CHUNK)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


class Floor:
    """Two relay processes chained in front of `target` (host:port)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.processes: list[subprocess.Popen] = []

    def start(self) -> str:
        """The URL through both relays."""
        to = self.target
        for _ in range(2):
            process = subprocess.Popen(
                [sys.executable, __file__, "--to", to], stdout=subprocess.PIPE, text=True, stderr=subprocess.DEVNULL
            )
            self.processes.append(process)
            assert process.stdout is not None
            to = f"127.0.0.1:{int(process.stdout.readline())}"
        return f"http://{to}/"

    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--to", required=True, help="host:port to relay to")
    args = parser.parse_args()
    host, port = args.to.rsplit(":", 1)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_relay(host, int(port)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

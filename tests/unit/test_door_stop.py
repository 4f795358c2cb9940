"""A worker's normal stop ends the door's open connections quietly:
the leader always follows the worker's container events through the
door (`GET /events`, core/swarm/worker_events.py), so a relay is open at every
stop. On Python 3.11 a connection's task that ends cancelled made asyncio's
start_server callback log "Exception in callback ... CancelledError" with a
traceback on every stop.

Run as the worker runs: its own process under asyncio.run, the door on real
TLS sockets, a stand-in engine on a Unix socket whose event stream never
ends, and a leader's connection still reading it when the door stops."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from support.door_tls import make_door_tls

KEY = "k" * 24

SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, sys
    from pathlib import Path
    from gpuhost_agent.service import swarm_tls
    from gpuhost_agent.streams.door import WorkerDoor

    logging.basicConfig(level=logging.DEBUG)  # asyncio's own errors, as the agent's logs take them
    KEY, base = sys.argv[1], Path(sys.argv[2])
    engine_path = str(base / "engine.sock")

    async def engine(reader, writer):  # the engine's event stream: a head, one event, then nothing for ever
        await reader.readuntil(b"\\r\\n\\r\\n")
        writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\n\\r\\n" + b'{"Type":"container"}\\n')
        await writer.drain()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:  # this stand-in ends quietly too: only the door is judged
            writer.close()

    async def main():
        engine_server = await asyncio.start_unix_server(engine, engine_path)
        door = WorkerDoor(KEY, engine=None, engine_path=engine_path, tls=swarm_tls.server_context(base / "worker-tls"))
        port = await door.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=swarm_tls.client_context(base / "leader-tls", node_checked=False)
        )
        writer.write(f"GET /events HTTP/1.1\\r\\nAuthorization: Bearer {KEY}\\r\\n\\r\\n".encode())
        await writer.drain()
        seen = b""
        while b'"container"' not in seen:  # the relay is running
            seen += await asyncio.wait_for(reader.read(4096), 10)
        await door.stop()  # the worker's stop (service/swarm_worker.py), its connection still open
        engine_server.close()
        print("stopped", door.served, flush=True)

    asyncio.run(main())
    """
)


def test_a_normal_stop_with_a_relay_open_logs_no_traceback(tmp_path) -> None:
    make_door_tls(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, KEY, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped 1", done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "CancelledError" not in done.stderr, done.stderr

"""An upgraded connection (a TTY exec, a tunnel's last hop through a door)
whose answer is not HTTP: whatever the engine, or another machine's agent,
sends back, the caller gets EngineUnreachable and the connection is closed."""

from __future__ import annotations

import asyncio
import ssl

import pytest
from support.door_tls import NODE, make_door_tls

from gpuhost_agent.runtime.door_client import DoorClient
from gpuhost_agent.runtime.engine.errors import ContainerGone, EngineUnreachable
from gpuhost_agent.runtime.engine.streams import EngineStreams

EXEC_ID = "a" * 64
# Answers a hostile or broken peer may give to the upgrade.
ANSWERS = {
    "no status code": b"HTTP/1.1\r\n\r\n",
    "a status that is no number": b"HTTP/1.1 OK fine\r\n\r\n",
    "a head cut short": b"HTTP/1.1 101 UPGRADED\r\nContent-Type: app",
    "no head at all": b"",
}


async def _answering(answer: bytes, tls: ssl.SSLContext | None) -> tuple[asyncio.Server, asyncio.Event]:
    """A server that reads the request's head, sends `answer`, and sets the event
    when the client closes its side."""
    closed = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            if answer.endswith(b"\r\n\r\n"):
                while await reader.read(4096):
                    pass
            else:
                await writer.drain()
                writer.write_eof() if tls is None else writer.close()
                while await reader.read(4096):
                    pass
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            closed.set()
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    return server, closed


@pytest.mark.parametrize("answer", ANSWERS.values(), ids=ANSWERS.keys())
async def test_the_engine_answering_an_exec_with_no_http_gives_unreachable(answer: bytes) -> None:
    server, closed = await _answering(answer, None)
    port = server.sockets[0].getsockname()[1]
    engine = EngineStreams(f"tcp://127.0.0.1:{port}", timeout=2)
    try:
        with pytest.raises(EngineUnreachable, match="exec start failed"):
            await engine.exec_start(EXEC_ID)
        await asyncio.wait_for(closed.wait(), 5)  # the client closed its side
    finally:
        await engine.close()
        server.close()


@pytest.mark.parametrize("answer", ANSWERS.values(), ids=ANSWERS.keys())
async def test_a_door_answering_a_connect_with_no_http_gives_unreachable(answer: bytes, tmp_path) -> None:
    door_tls = await asyncio.to_thread(make_door_tls, tmp_path)
    server, closed = await _answering(answer, door_tls.server())
    port = server.sockets[0].getsockname()[1]
    door = DoorClient("127.0.0.1", port, "k" * 32, door_tls.checked_client(), NODE)
    try:
        with pytest.raises(EngineUnreachable, match="connect failed"):
            await door.connect_through(EXEC_ID, "10.0.0.2", 80)
        await asyncio.wait_for(closed.wait(), 5)
    finally:
        await door.close()
        server.close()


async def test_a_404_to_an_upgrade_is_container_gone_and_closes_the_connection() -> None:
    server, closed = await _answering(
        b'HTTP/1.1 404 Not Found\r\nContent-Length: 30\r\n\r\n{"message":"no such exec: a"}\n', None
    )
    port = server.sockets[0].getsockname()[1]
    engine = EngineStreams(f"tcp://127.0.0.1:{port}", timeout=2)
    try:
        with pytest.raises(ContainerGone, match="no such exec"):
            await engine.exec_start(EXEC_ID)
        await asyncio.wait_for(closed.wait(), 5)
    finally:
        await engine.close()
        server.close()

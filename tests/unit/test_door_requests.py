"""What reaches the engine through the worker's door (streams/door.py),
on real sockets: a client speaks raw bytes to the door, a fake engine on a
Unix socket records every byte the door sends it. The door rebuilds each
request from checked values: no client byte reaches the engine's request
head, and an exec's body is read as the engine's Go decoder reads it (any
case of a key, duplicates) and written again from the fields allowed."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from support.door_tls import DoorTls, make_door_tls

from gpuhost_agent.protocol import wire
from gpuhost_agent.streams.door import WorkerDoor

KEY = "k" * 24


@pytest.fixture
def door_tls(tmp_path) -> DoorTls:
    """The environment's CA, the leader's and a worker's certificates (service/swarm_tls.py)."""
    return make_door_tls(tmp_path)


_SOCKETS = itertools.count()
ID = "5e7140ba6f17c65a09300a61fbb9e36a520b40a8869c52175d0f97f718ab2a59"


class _Engine:
    """The door's view of its engine for the checks: every container is the agent's."""

    async def inspect(self, ident: str) -> dict:
        return {"Id": ident, "Config": {"Labels": {wire.LABEL_MANAGED: "true"}}, "State": {"Running": True}}

    async def exec_inspect(self, ident: str) -> dict:
        return {"ContainerID": ID}


async def _through(tls: DoorTls, tmp_path, raw: bytes) -> tuple[bytes, bytes]:
    """(the door's answer to `raw`, every byte the engine got)."""
    got = bytearray()

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            got.extend(chunk)
            if b"\r\n\r\n" in got:  # answers the first request, then reads on until the door closes
                writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                await writer.drain()
                writer.close()
                break

    path = str(tmp_path / f"engine-{next(_SOCKETS)}.sock")
    server = await asyncio.start_unix_server(engine, path)
    proxy = WorkerDoor(KEY, _Engine(), path, tls=tls.server())  # type: ignore[arg-type]
    port = await proxy.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls.client())
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        await asyncio.sleep(0.1)  # anything else the door would still send
    finally:
        await proxy.stop()
        server.close()
        await server.wait_closed()
    return answer, bytes(got)


def _request(method: str, target: str, headers: str, body: bytes = b"") -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer {KEY}\r\n{headers}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


SMUGGLED = (
    "POST /containers/create HTTP/1.1\nHost: docker\nContent-Type: application/json\nContent-Length: 64\n\n"
    '{"Image":"x","HostConfig":{"Privileged":true,"Binds":["/:/host"]}}'
)


@pytest.mark.parametrize(
    "headers",
    [
        f"Content-Type: application/json\nContent-Length: 0\n\n{SMUGGLED}\r\n",  # bare LF inside a value
        "Content-Type: application/json\r\nX-Note: a\rb\r\n",  # a bare CR
        "Content-Type: application/json\r\n folded: continuation\r\n",  # an obsolete line fold
        "Content-Type: application/json\x00\r\n",  # a control character
        "Content-Length: 2\r\n",  # two lengths
    ],
)
async def test_a_head_with_bare_line_ends_or_odd_bytes_is_refused_before_the_engine(
    door_tls, tmp_path, headers
) -> None:
    body = json.dumps({"Cmd": ["id"]}).encode()
    answer, engine_got = await _through(door_tls, tmp_path, _request("POST", f"/containers/{ID}/exec", headers, body))
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert engine_got == b""


async def test_the_engine_gets_a_head_of_the_doors_own_making_whatever_the_client_sent(door_tls, tmp_path) -> None:
    headers = "Content-Type: text/plain; boundary=x\r\nX-Registry-Auth: e30=\r\nConnection: keep-alive\r\n"
    body = json.dumps({"Cmd": ["id"], "AttachStdout": True}).encode()
    answer, engine_got = await _through(
        door_tls, tmp_path, _request("POST", f"/v1.41/containers/{ID}/exec", headers, body)
    )
    assert answer.startswith(b"HTTP/1.1 201"), answer
    head, _, sent_body = engine_got.partition(b"\r\n\r\n")
    assert head.decode().split("\r\n") == [
        f"POST /v1.41/containers/{ID}/exec HTTP/1.1",
        "Host: docker",
        "Content-Type: application/json",
        f"Content-Length: {len(sent_body)}",
        "Connection: close",
    ]
    assert json.loads(sent_body) == {"Cmd": ["id"], "AttachStdout": True}


async def test_a_query_reaches_the_engine_as_the_door_writes_it(door_tls, tmp_path) -> None:
    target = f"/containers/{ID}/logs?follow=1&stdout=1&tail=10&since=1700000000.5&x=%0d%0aHost:%20y"
    answer, engine_got = await _through(door_tls, tmp_path, _request("GET", target, ""))
    assert answer.startswith(b"HTTP/1.1 201"), answer
    line = engine_got.split(b"\r\n", 1)[0].decode()
    assert line == f"GET /containers/{ID}/logs?follow=1&stdout=1&tail=10&since=1700000000.5 HTTP/1.1"
    answer, engine_got = await _through(door_tls, tmp_path, _request("GET", f"/containers/{ID}/logs?tail=1&tail=2", ""))
    assert answer.startswith(b"HTTP/1.1 400") and engine_got == b""


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"Cmd": ["id"], "privileged": true}', 403),  # Go's decoder matches a key in any case
        (b'{"Cmd": ["id"], "PRIVILEGED": 1}', 403),
        (b'{"Cmd": ["id"], "Privileged": false, "privileged": true}', 400),  # twice, in two cases
        (b'{"Cmd": ["id"], "Cmd": ["sh"]}', 400),  # twice: Go keeps the last
        (b'{"Cmd": ["id"], "User": "0"}', 400),  # a field the door does not pass on
        (b'{"Cmd": ["id"], "HostConfig": {"Privileged": true}}', 400),
        (b'{"Cmd": ["id"], "Pr\\u0131vileged": true}', 400),  # a key outside ASCII
        (b'{"Cmd": "id"}', 400),  # of the wrong type
        (b'["Privileged"]', 400),
    ],
)
async def test_an_exec_body_is_read_as_the_engine_reads_it_and_refused_unless_plain(
    door_tls, tmp_path, body, status
) -> None:
    answer, engine_got = await _through(door_tls, tmp_path, _request("POST", f"/containers/{ID}/exec", "", body))
    assert answer.startswith(f"HTTP/1.1 {status}".encode()), answer
    assert engine_got == b""


async def test_the_engine_gets_an_exec_body_of_the_allowed_fields_written_again(door_tls, tmp_path) -> None:
    body = b'{"cmd": ["id"], "tty": true, "Privileged": false, "env": ["A=1"]}'
    answer, engine_got = await _through(door_tls, tmp_path, _request("POST", f"/containers/{ID}/exec", "", body))
    assert answer.startswith(b"HTTP/1.1 201"), answer
    assert json.loads(engine_got.partition(b"\r\n\r\n")[2]) == {"Cmd": ["id"], "Tty": True, "Env": ["A=1"]}
    start = b'{"Detach": false, "Tty": true, "ConsoleSize": [1, 1]}'
    answer, engine_got = await _through(door_tls, tmp_path, _request("POST", f"/exec/{ID}/start", "", start))
    assert answer.startswith(b"HTTP/1.1 400") and engine_got == b""

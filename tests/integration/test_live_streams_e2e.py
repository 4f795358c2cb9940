"""Logs and terminals as a renter gets them: renter HTTP -> local marketplace ->
the agent's channel -> the real Docker Engine, and back.

What the renter receives is compared with what Docker itself says of the same
container (`docker logs`, which keeps stdout and stderr apart), so "exactly the
lines the container printed" is checked against the engine, not against a
copy of our own expectations.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import aiohttp
from support.engine import env_containers
from support.renter_streams import STDERR, STDOUT, SYSTEM, Demux, create_terminal, logs_path, read_logs, terminal_until
from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import wire, wire_time

PRINTER = f"""
services:
  app:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "i=1; while [ $$i -le 300 ]; do echo out-$$i; echo err-$$i >&2; i=$$((i+1)); done; sleep 2.5; echo after-pause; exec sleep 3600"]
    stop_grace_period: 1s
"""

SHELL = f"""
services:
  box:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
    stop_grace_period: 1s
"""


async def _deployed(renter, content: str):
    rental_id, stack_id, _job = await renter.deployed(content)
    await until(lambda: renter.store.containers.get(stack_id, {}).get("containers"), timeout=10)
    (container,) = renter.store.containers[stack_id]["containers"]
    return rental_id, stack_id, container


def _docker_lines(container_id: str, *flags: str) -> tuple[list[str], list[str]]:
    """(stdout lines, stderr lines) as `docker logs` on the host shows them."""
    done = subprocess.run(["docker", "logs", *flags, container_id], capture_output=True, check=True, timeout=30)
    return done.stdout.decode().splitlines(), done.stderr.decode().splitlines()


async def test_logs_tail_since_timestamps_exact(local_market, docker_client):
    renter, _parts, _local = local_market
    rental_id, stack_id, container = await _deployed(renter, PRINTER)
    cid = container["Id"]
    await until(lambda: asyncio.to_thread(lambda: "after-pause" in docker_client.api.logs(cid).decode()), timeout=15)
    path = logs_path(rental_id, stack_id, cid)
    key = renter.store.renterApiKey

    status, demux, content_type = await read_logs(renter.http, renter.base_url, key, path)
    assert status == 200 and content_type.startswith("application/vnd.docker.multiplexed-stream")
    assert demux.lines(STDOUT) == [f"out-{i}" for i in range(1, 301)] + ["after-pause"]
    assert demux.lines(STDERR) == [f"err-{i}" for i in range(1, 301)]
    assert demux.lines(SYSTEM) == [] and demux.leftover == 0

    status, demux, _ = await read_logs(renter.http, renter.base_url, key, path, tail=5)
    assert status == 200
    assert (demux.lines(STDOUT), demux.lines(STDERR)) == await asyncio.to_thread(_docker_lines, cid, "--tail", "5")
    assert len(demux.lines(STDOUT) + demux.lines(STDERR)) == 5

    status, demux, _ = await read_logs(renter.http, renter.base_url, key, path, timestamps=True, tail=20)
    assert (demux.lines(STDOUT), demux.lines(STDERR)) == await asyncio.to_thread(
        _docker_lines, cid, "--tail", "20", "--timestamps"
    )
    stamp = demux.lines(STDOUT)[-1].split(" ", 1)[0]
    assert stamp.endswith("Z") and "T" in stamp

    # since: a second after the last line before the pause, only what came after it.
    _, all_stamped, _ = await read_logs(renter.http, renter.base_url, key, path, timestamps=True)
    last_before = next(line for line in reversed(all_stamped.lines(STDOUT)) if line.endswith("out-300"))
    since = int(wire_time.parse_iso(last_before.split(" ", 1)[0][:26] + "Z").timestamp()) + 1
    status, demux, _ = await read_logs(renter.http, renter.base_url, key, path, since=since)
    assert status == 200
    assert (demux.lines(STDOUT), demux.lines(STDERR)) == (["after-pause"], [])

    # By name as well as by id; never a container of another stack.
    status, demux, _ = await read_logs(
        renter.http, renter.base_url, key, logs_path(rental_id, stack_id, container["Name"]), tail=1
    )
    assert status == 200 and demux.lines(STDOUT) == ["after-pause"]
    other_rental, other_stack, _other = await _deployed(renter, SHELL)
    status, _, _ = await read_logs(renter.http, renter.base_url, key, logs_path(other_rental, other_stack, cid))
    assert status == 404
    status, _, _ = await read_logs(renter.http, renter.base_url, key, path, tail="minus-one")
    assert status == 400


async def test_follow_streams_new_lines_and_ends_on_removal(local_market, docker_client):
    renter, _parts, _local = local_market
    rental_id, stack_id, container = await _deployed(renter, SHELL)
    cid = container["Id"]
    url = renter.base_url + logs_path(rental_id, stack_id, cid)
    demux = Demux()
    async with renter.http.get(
        url, params={"follow": "true"}, headers={wire.API_KEY_HEADER: renter.store.renterApiKey}
    ) as response:
        assert response.status == 200
        for i in range(3):
            await asyncio.to_thread(
                lambda i=i: docker_client.api.exec_start(
                    docker_client.api.exec_create(
                        cid, ["sh", "-c", f"echo late-{i} > /proc/1/fd/1; echo late-err-{i} > /proc/1/fd/2"]
                    )
                )
            )
        deadline = time.monotonic() + 10
        while len(demux.lines(STDOUT)) < 3 or len(demux.lines(STDERR)) < 3:
            assert time.monotonic() < deadline, demux.frames
            demux.feed(await asyncio.wait_for(response.content.readany(), 10))
        assert demux.lines(STDOUT) == ["late-0", "late-1", "late-2"]
        assert demux.lines(STDERR) == ["late-err-0", "late-err-1", "late-err-2"]

        await asyncio.to_thread(docker_client.api.remove_container, cid, force=True)
        rest = await asyncio.wait_for(response.content.read(), 10)  # the response ends: EOF
        demux.feed(rest)
    assert demux.leftover == 0


async def test_follow_ends_when_the_container_stops_as_docker_logs_f(local_market, docker_client):
    """`docker logs -f` returns when its container stops and, on a stopped
    container, prints the log and returns: a renter's follow does the same."""
    renter, _parts, _local = local_market
    rental_id, stack_id, container = await _deployed(renter, SHELL)
    cid = container["Id"]
    await asyncio.to_thread(
        lambda: docker_client.api.exec_start(
            docker_client.api.exec_create(cid, ["sh", "-c", "echo said > /proc/1/fd/1"])
        )
    )
    url = renter.base_url + logs_path(rental_id, stack_id, cid)
    headers = {wire.API_KEY_HEADER: renter.store.renterApiKey}
    demux = Demux()
    async with renter.http.get(url, params={"follow": "true"}, headers=headers) as response:
        while demux.lines(STDOUT) != ["said"]:
            demux.feed(await asyncio.wait_for(response.content.readany(), 10))
        await asyncio.to_thread(docker_client.api.stop, cid, timeout=1)
        demux.feed(await asyncio.wait_for(response.content.read(), 15))  # EOF, the container stopped
    assert demux.lines(SYSTEM) == ["gpuhost: container exited with code 137"] and demux.leftover == 0

    status, demux, _ = await asyncio.wait_for(
        read_logs(
            renter.http, renter.base_url, renter.store.renterApiKey, logs_path(rental_id, stack_id, cid), follow=True
        ),
        10,
    )
    assert status == 200 and demux.lines(STDOUT) == ["said"] and demux.lines(SYSTEM) == []


async def test_terminal_commands_resize_exit_and_two_at_once(local_market):
    renter, _parts, _local = local_market
    rental_id, stack_id, container = await _deployed(renter, SHELL)
    key = renter.store.renterApiKey

    status, body = await create_terminal(
        renter.http, renter.base_url, key, rental_id, stack_id, container["Id"], cols=80, rows=24
    )
    assert status == 201, body
    assert set(body) >= {"terminalId", "url", "expiresAt"} and body["url"].startswith("ws://127.0.0.1:")
    status2, body2 = await create_terminal(renter.http, renter.base_url, key, rental_id, stack_id, container["Name"])
    assert status2 == 201, body2

    async with renter.http.ws_connect(body["url"]) as first, renter.http.ws_connect(body2["url"]) as second:
        await first.send_bytes(b"echo one-$((6*7))\n")
        await second.send_bytes(b"echo two-$((5*5))\n")
        assert "one-42" in await terminal_until(first, "one-42")
        assert "two-25" in await terminal_until(second, "two-25")

        await first.send_str(json.dumps({"type": "resize", "cols": 123, "rows": 45}))
        await asyncio.sleep(0.2)
        await first.send_bytes(b"stty size\n")
        assert "45 123" in await terminal_until(first, "45 123")

        await second.send_bytes(b"exit 3\n")
        seen = await terminal_until(second, '"exitCode"')
        end = json.loads(seen[seen.index("<text ") + 6 : seen.rindex(">")])
        assert end == {"type": "end", "reason": "exited", "exitCode": 3}
        assert (await second.receive(timeout=5)).type in (
            aiohttp.WSMsgType.CLOSE,
            aiohttp.WSMsgType.CLOSED,
            aiohttp.WSMsgType.CLOSING,
        )

        await first.send_bytes(b"echo still-here\n")
        assert "still-here" in await terminal_until(first, "still-here")

    # The URL was single-use.
    try:
        async with renter.http.ws_connect(body["url"]):
            raise AssertionError("a terminal URL opened twice")
    except aiohttp.WSServerHandshakeError as exc:
        assert exc.status in (401, 404)


async def test_rental_end_ends_its_terminals(local_market, docker_client):
    renter, _parts, _local = local_market
    rental_id, stack_id, container = await _deployed(renter, SHELL)
    status, body = await create_terminal(
        renter.http, renter.base_url, renter.store.renterApiKey, rental_id, stack_id, container["Id"]
    )
    assert status == 201
    async with renter.http.ws_connect(body["url"]) as ws:
        await ws.send_bytes(b"echo ready\n")
        await terminal_until(ws, "ready")
        status, _ = await renter.call("DELETE", f"/rentals/{rental_id}")
        assert status == 200
        deadline = time.monotonic() + 15
        while True:
            message = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                break
    await until(lambda: asyncio.to_thread(lambda: not env_containers(docker_client, renter.store.envId)), timeout=20)

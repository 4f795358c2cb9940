"""Tunnels end to end: the local marketplace's loopback listeners, the agent's
channel and the real engine, driven by real clients (curl, a TCP socket).

The services run in the offline busybox image: httpd for HTTP, a shell loop
that starts httpd late for the 503-then-200 case, and nc for a TCP echo.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from pathlib import Path

import aiohttp
import pytest
from support.openapi_check import check_named
from support.stacks import TEST_IMAGE, TLS_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import wire

WEB_AND_ECHO = f"""
services:
  web:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /www && echo hello through the tunnel > /www/index.html && exec httpd -f -p 8080 -h /www"]
    expose: ["8080"]
    stop_grace_period: 1s
  echo:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "exec nc -ll -p 9000 -e cat"]
    expose: ["9000", "9001"]
    stop_grace_period: 1s
  late:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /www && echo finally up > /www/index.html && until [ -f /go ]; do sleep 0.1; done && exec httpd -f -p 8000 -h /www"]
    expose: ["8000"]
    stop_grace_period: 1s
"""


def _curl(url: str) -> tuple[int, str, str]:
    """(status, body, headers) as a renter's curl sees them."""
    done = subprocess.run(
        ["curl", "-sS", "--max-time", "10", "-D", "-", url], capture_output=True, text=True, timeout=20, check=True
    )
    head, _, body = done.stdout.replace("\r\n", "\n").partition("\n\n")  # busybox httpd ends lines with \n
    return int(head.split()[1]), body, head


async def _echo(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    writer.write_eof()  # half-close: the echo answers, then the service closes
    received = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return received


async def test_http_tcp_late_service_restart_and_tunnel_info(local_market, docker_client, local_doc):
    renter, _parts, _local = local_market
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, WEB_AND_ECHO, name="tunnels")
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    tunnels = {(t["service"], t["containerPort"]): t for t in await renter.tunnels(rental_id, stack_id, 4)}
    for tunnel in tunnels.values():
        check_named(local_doc, tunnel, "Tunnel")
    web, echo = tunnels[("web", 8080)], tunnels[("echo", 9000)]
    assert web["protocol"] == "http" and web["url"] == f"http://127.0.0.1:{web['port']}/" and web["auth"] is None
    assert echo["protocol"] == "tcp" and echo["url"] is None and echo["host"] == "127.0.0.1"

    # HTTP through the tunnel, with a real curl
    status, body, _ = await asyncio.to_thread(_curl, web["url"])
    assert (status, body.strip()) == (200, "hello through the tunnel")

    # A raw TCP echo
    payload = b"bytes both ways\n" * 1000
    assert await _echo(echo["port"], payload) == payload

    # A declared port nobody listens on: a TCP client is closed, nothing else
    assert await _echo(tunnels[("echo", 9001)]["port"], b"x") == b""

    # A service that starts late: 503 with Retry-After and a page, then 200
    late = tunnels[("late", 8000)]
    status, body, head = await asyncio.to_thread(_curl, late["url"])
    assert status == 503 and "retry-after: 2" in head.lower() and "starting" in body
    late_container = await asyncio.to_thread(docker_client.containers.get, late["containerId"])
    await asyncio.to_thread(late_container.exec_run, ["touch", "/go"])
    for _ in range(40):
        status, body, _ = await asyncio.to_thread(_curl, late["url"])
        if status == 200:
            break
        await asyncio.sleep(0.25)
    assert (status, body.strip()) == (200, "finally up")

    # The container tunnel endpoint, as documented
    status, listed = await renter.call(
        "GET", f"/rentals/{rental_id}/stacks/{stack_id}/containers/{web['containerId']}/tunnels"
    )
    assert status == 200 and [t["tunnelId"] for t in listed] == [web["tunnelId"]]
    assert listed[0]["status"] == "ready"  # a connection reached the service
    status, _ = await renter.call("GET", f"/rentals/{rental_id}/stacks/{stack_id}/containers/nope/tunnels")
    assert status == 404

    # A restart gives the container a new address; the tunnel still reaches it
    container = await asyncio.to_thread(docker_client.containers.get, web["containerId"])
    await asyncio.to_thread(container.restart, timeout=1)
    for _ in range(40):
        try:
            status, body, _ = await asyncio.to_thread(_curl, web["url"])
        except subprocess.CalledProcessError:
            status = 0
        if status == 200:
            break
        await asyncio.sleep(0.25)
    assert (status, body.strip()) == (200, "hello through the tunnel")

    # Removing the stack closes its listeners
    status, _ = await renter.call("DELETE", f"/rentals/{rental_id}/stacks/{stack_id}")
    assert status == 200
    await renter.wait_stack(rental_id, stack_id, (), timeout=30)
    await until(lambda: not _local_listens(echo["port"]), timeout=10)


def _local_listens(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("port", [22, 8080])
async def test_the_agent_refuses_what_the_container_does_not_declare(local_market, port):
    """Asked directly on the channel for a port the container does not declare
    (22) or for another rental's container (8080 of a stack in rental B, asked
    as rental A), the agent refuses: no connection is made."""
    renter, _parts, local = local_market
    rental_a, rental_b = await renter.rental(), await renter.rental()
    stack_b = await renter.stack(rental_b, WEB_AND_ECHO, name="b")
    stack = await renter.wait_stack(rental_b, stack_b, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    tunnels = await renter.tunnels(rental_b, stack_b, 4)
    web = next(t for t in tunnels if t["containerPort"] == 8080)
    from gpuhost_agent.local_marketplace.channel_hub import StreamRefused

    asking_rental = rental_b if port == 22 else rental_a
    with pytest.raises(StreamRefused) as refused:
        await local.state.streams.open(
            "tunnel", asking_rental, {"stackId": stack_b, "containerId": web["containerId"], "port": port}
        )
    assert refused.value.status in (403, 404)
    assert ("not a TCP port this container declares" if port == 22 else "no such container") in refused.value.message


AUTHED = f"""
services:
  web:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /www && echo behind a password > /www/index.html && exec httpd -f -p 8080 -h /www"]
    expose: ["8080"]
    stop_grace_period: 1s
  mirror:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "exec nc -ll -p 8000 -e cat"]
    expose: ["8000"]
    stop_grace_period: 1s
"""


async def _mirror(port: int, head: bytes, count: int = 1) -> bytes:
    """What the service received of `count` request heads sent on one
    connection: the mirror sends the bytes back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head * count)
    await writer.drain()
    received = b"".join([await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) for _ in range(count)])
    writer.close()
    return received


@pytest.mark.parametrize("basic_auth", [True, False])
async def test_basic_auth_at_the_marketplace(local_market, local_doc, basic_auth):
    renter, _parts, _local = local_market
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, AUTHED, name="auth", isBasicAuthEnabled=basic_auth)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    tunnels = {t["service"]: t for t in await renter.tunnels(rental_id, stack_id, 2)}
    web, mirror = tunnels["web"], tunnels["mirror"]
    for tunnel in tunnels.values():
        check_named(local_doc, tunnel, "Tunnel")
    service_auth = b"Authorization: Bearer the-services-own\r\n"
    if not basic_auth:
        assert web["auth"] is None
        status, body, _ = await asyncio.to_thread(_curl, web["url"])
        assert (status, body.strip()) == (200, "behind a password")
        seen = await _mirror(mirror["port"], b"GET / HTTP/1.1\r\nHost: localhost\r\n" + service_auth + b"\r\n")
        assert service_auth in seen, "without basic auth the service's own Authorization passes untouched"
        return

    auth = web["auth"]
    assert auth["type"] == "basic" and auth["username"] == "renter" and auth["password"]
    assert auth["password"] not in str(_local.state.store.stacks[stack_id]), "stored hashed only"
    status, _, head = await asyncio.to_thread(_curl, web["url"])
    assert status == 401 and "www-authenticate: basic" in head.lower()
    status, _, _ = await asyncio.to_thread(_curl, web["url"].replace("http://", "http://renter:wrong@"))
    assert status == 401
    with_password = web["url"].replace("http://", f"http://renter:{auth['password']}@")
    status, body, _ = await asyncio.to_thread(_curl, with_password)
    assert (status, body.strip()) == (200, "behind a password")

    # the link signs a browser in: a cookie, then requests with it go through
    status, _, head = await asyncio.to_thread(_curl, auth["link"])
    assert status == 200 and f"set-cookie: gpuhost_tunnel_{web['tunnelId']}=" in head.lower()
    cookie = next(
        line.split(":", 1)[1].split(";")[0].strip()
        for line in head.splitlines()
        if line.lower().startswith("set-cookie")
    )
    done = await asyncio.to_thread(
        subprocess.run,
        ["curl", "-sS", "--max-time", "10", "-b", cookie, web["url"]],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.stdout.strip() == "behind a password"

    # what reaches the service, of each request of a kept-alive connection: none of ours,
    # its other cookies, the client's keep-alive
    mirror_password = mirror["auth"]["password"]
    ours = base64.b64encode(f"renter:{mirror_password}".encode())
    seen = await _mirror(
        mirror["port"],
        b"GET / HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic "
        + ours
        + b"\r\nCookie: theme=dark\r\nConnection: keep-alive\r\n\r\n",
        count=2,
    )
    assert seen.count(b"GET / HTTP/1.1") == 2 and seen.count(b"Cookie: theme=dark") == 2, seen
    assert b"Authorization" not in seen and b"Connection: keep-alive" in seen


# A service that makes its own self-signed certificate at start and speaks only HTTPS.
HTTPS_ORIGIN = f"""
services:
  secure:
    image: {TLS_IMAGE}
    command: ["sh", "-c", "mkdir -p /tmp && cd /tmp && openssl req -x509 -newkey rsa:2048 -nodes -keyout k.pem -out c.pem -subj /CN=origin -days 2 2>/dev/null && exec openssl s_server -quiet -accept 8080 -cert c.pem -key k.pem -www"]
    expose: ["8080"]
    stop_grace_period: 1s
"""


@pytest.mark.parametrize("insecure", [True, False])
async def test_an_https_origin_with_a_self_signed_certificate(local_market, insecure):
    """`insecure`: the agent speaks TLS to the service without verifying it, and
    the renter's curl gets the page over the plain tunnel. Without it the
    tunnel speaks plain HTTP to a TLS port, and the renter gets no page."""
    renter, _parts, _local = local_market
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, HTTPS_ORIGIN, name="https", insecure=insecure)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    (tunnel,) = await renter.tunnels(rental_id, stack_id, 1)
    status, body = 503, ""
    for _ in range(40):  # 503 "starting" while openssl makes its key
        done = await asyncio.to_thread(
            subprocess.run,
            ["curl", "-sS", "--max-time", "5", "-w", "\n%{http_code}", tunnel["url"]],
            capture_output=True,
            text=True,
            timeout=20,
        )
        body, _, code = done.stdout.rpartition("\n")
        status = int(code or 0)
        if status != 503:
            break
        await asyncio.sleep(0.25)
    if insecure:
        assert status == 200 and "s_server" in body, (status, body[:300])
    else:
        assert status != 200 and "s_server" not in body, (status, body[:300])


# The echo server's script travels in the stack itself (Compose's `$$` is a `$`).
WS_ECHO = f"""
services:
  ws:
    image: {TEST_IMAGE}
    environment:
      WS_ECHO: {json.dumps((Path(__file__).parent.parent / "support" / "ws_echo.sh").read_text().replace("$", "$$"))}
    command: ["sh", "-c", "printf '%s' \\"$$WS_ECHO\\" > /ws.sh && exec nc -ll -p 8080 -e sh /ws.sh"]
    expose: ["8080"]
    stop_grace_period: 1s
"""


async def test_a_websocket_through_an_http_tunnel(local_market):
    """The upgrade and the frames pass the byte relay both ways, with a real
    WebSocket client that checks the handshake and the framing."""
    renter, _parts, _local = local_market
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, WS_ECHO, name="ws")
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    (tunnel,) = await renter.tunnels(rental_id, stack_id, 1)
    assert tunnel["protocol"] == "http"
    url = tunnel["url"].replace("http://", "ws://")
    async with aiohttp.ClientSession() as http:
        for _ in range(40):  # 503 while nc is not listening yet
            try:
                ws = await http.ws_connect(url, timeout=aiohttp.ClientWSTimeout(ws_close=5))
                break
            except aiohttp.WSServerHandshakeError as exc:
                assert exc.status == 503, exc
                await asyncio.sleep(0.25)
        async with ws:
            for text in ("hello", "through the tunnel", "x" * 125):
                await ws.send_str(text)
                message = await ws.receive(timeout=10)
                assert (message.type, message.data) == (aiohttp.WSMsgType.TEXT, text)

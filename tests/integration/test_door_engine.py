"""The worker's door for the leader (streams/door.py) on the real engine,
asked by the leader's own client (runtime/door_client.py) and by curl: a
terminal in a container the agent manages works through it, both ways, and
so do a tunnel's last hop, a file session, an exec's hang-up, a signal and the
engine's events (of the agent's containers alone);
the key is required; the host's other containers, every other path of the
engine API and a privileged exec are refused."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess

import pytest
from support.door_tls import DoorTls, make_door_tls
from support.stacks import TEST_IMAGE, TLS_IMAGE

from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.docker_host import parse_docker_host
from gpuhost_agent.runtime.door_client import DoorClient
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.streams import ContainerAt, EngineStreams
from gpuhost_agent.streams.door import WorkerDoor

KEY = "k" * 24


SERVE = "mkdir /www && echo through-the-door > /www/i && exec httpd -f -p 8080 -h /www"


@pytest.fixture
def containers(docker_client):
    """The agent's container on a network of its stack (a tunnel dials only
    there: streams/sandbox_addresses.py), and a container not the agent's."""
    project = {"com.docker.compose.project": "door-test"}
    network = docker_client.networks.create("door-test", labels={**project, "gpuhost-test": "door"})
    made = []
    for managed in ("true", "false"):
        made.append(
            docker_client.containers.run(
                TEST_IMAGE,
                ["sh", "-c", SERVE],
                detach=True,
                labels={wire.LABEL_MANAGED: managed, "gpuhost-test": "door", **project},
                ports={"8080/tcp": None, "9000/tcp": None},  # declared (ExposedPorts); nothing on 9000
                network=network.name,
            )
        )
    yield made[0].id, made[1].id
    for container in made:
        container.remove(force=True)
    network.remove()


@pytest.fixture
def door_tls(tmp_path) -> DoorTls:
    """The environment's CA, the leader's and a worker's certificates (service/swarm_tls.py)."""
    tls = make_door_tls(tmp_path)
    TLS["door"] = tls
    return tls


TLS: dict[str, DoorTls] = {}  # this test's, for curl


@pytest.fixture
async def door(proxy, door_tls):
    """The leader's client of the door."""
    remote = DoorClient("127.0.0.1", proxy[1], KEY, door_tls.client())
    yield remote
    await remote.close()


@pytest.fixture
async def proxy(door_tls):
    local = EngineStreams()
    engine_path = parse_docker_host(os.environ.get("DOCKER_HOST")).unix_path
    assert engine_path
    served = WorkerDoor(KEY, local, engine_path, tls=door_tls.server())
    port = await served.start("127.0.0.1", 0)
    yield served, port
    await served.stop()
    await local.close()


def curl(port: int, method: str, path: str, key: str | None = KEY, body: dict | None = None) -> tuple[int, str]:
    args = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", *TLS["door"].curl(), "-X", method]
    args.append(f"https://127.0.0.1:{port}{path}")
    if key is not None:
        args += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "--data", json.dumps(body)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=True).stdout
    text, _, code = out.rpartition("\n")
    return int(code), text


async def test_a_terminal_in_a_managed_container_works_through_the_door(proxy, door, containers) -> None:
    served, _ = proxy
    managed, _ = containers
    assert (await door.inspect(managed))["Id"] == managed
    exec_id = await door.exec_create(managed, ["sh", "-c", "echo ready; read line; echo got-$line"], {})
    reader, writer = await door.exec_start(exec_id)
    assert b"ready" in await asyncio.wait_for(reader.readuntil(b"ready"), 10)
    await door.exec_resize(exec_id, rows=30, cols=100)
    writer.write(b"hello\n")
    await writer.drain()
    rest = b""
    while b"got-hello" not in rest:
        chunk = await asyncio.wait_for(reader.read(1024), 10)
        assert chunk, rest
        rest += chunk
    writer.close()
    assert await door.exec_exit_code(exec_id, 10) == 0
    with pytest.raises(EngineError, match="404"):  # an ended exec: the engine's own answer, relayed
        await door.exec_resize(exec_id, rows=30, cols=100)
    assert served.served >= 4


async def test_without_the_key_or_outside_the_agents_containers_nothing_is_served(
    proxy, containers, docker_client
) -> None:
    served, port = proxy
    managed, foreign = containers
    assert (await asyncio.to_thread(curl, port, "GET", f"/containers/{managed}/json", key=None))[0] == 401
    assert (await asyncio.to_thread(curl, port, "GET", f"/containers/{managed}/json", key="x" * 24))[0] == 401
    status, text = await asyncio.to_thread(curl, port, "GET", f"/v1.41/containers/{managed}/json")
    assert status == 200 and json.loads(text)["Id"] == managed
    assert (await asyncio.to_thread(curl, port, "GET", f"/containers/{foreign}/json"))[0] == 403
    assert (await asyncio.to_thread(curl, port, "POST", f"/containers/{foreign}/exec", body={"Cmd": ["id"]}))[0] == 403
    for method, path in (("GET", "/containers/json"), ("GET", "/info"), ("POST", "/containers/create")):
        assert (await asyncio.to_thread(curl, port, method, path))[0] == 403, path
    assert (await asyncio.to_thread(curl, port, "POST", f"/containers/{managed}/stop"))[0] == 403
    privileged = {"Cmd": ["id"], "Privileged": True, "AttachStdout": True}
    assert (await asyncio.to_thread(curl, port, "POST", f"/containers/{managed}/exec", body=privileged))[0] == 403
    status, text = await asyncio.to_thread(curl, port, "POST", f"/containers/{managed}/exec", body={"Cmd": ["id"]})
    assert status == 201 and json.loads(text)["Id"]
    foreign_exec = (await asyncio.to_thread(docker_client.api.exec_create, foreign, ["true"]))["Id"]
    assert (await asyncio.to_thread(curl, port, "GET", f"/exec/{foreign_exec}/json"))[0] == 403
    assert (await asyncio.to_thread(curl, port, "POST", f"/exec/{foreign_exec}/start", body={"Detach": True}))[0] == 403
    assert served.refused >= 10


async def test_a_tunnels_last_hop_is_dialled_from_inside_the_container_to_a_declared_port(
    door, containers, docker_client
) -> None:
    managed, foreign = containers
    info = await asyncio.to_thread(docker_client.api.inspect_container, managed)
    address = next(iter(info["NetworkSettings"]["Networks"].values()))["IPAddress"]
    for _ in range(50):  # httpd starting
        try:
            reader, writer = await door.connect_through(managed, address, 8080)
        except EngineError as exc:
            assert "503" in str(exc) or "reach" in str(exc), exc
            await asyncio.sleep(0.1)
            continue
        break
    writer.write(b"GET /i HTTP/1.0\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.") and answer.rstrip().endswith(b"through-the-door"), answer
    for container, where, to, refused in (
        (managed, address, 22, "not a TCP port this container declares"),
        (managed, "127.0.0.1", 8080, "not one of the container's own addresses"),
        (foreign, address, 8080, "not a container of the agent"),
        (managed, address, 9000, "the service refused the connection"),
    ):
        with pytest.raises(EngineError, match=refused):
            await door.connect_through(container, where, to)


async def test_a_file_session_runs_in_the_container_on_its_machine(door, containers, docker_client, tmp_path) -> None:
    """SFTP's helper starts beside the container and is confined to it: a
    path names the container's file, never the host's."""
    managed, foreign = containers
    info = await asyncio.to_thread(docker_client.api.inspect_container, managed)
    host_only = tmp_path / "host-only"
    await asyncio.to_thread(host_only.write_text, "host secret\n")
    files = await door.open_files(ContainerAt(info))
    try:
        for _ in range(50):  # the container writing /www/i
            try:
                handle, _ = await files.call("open", "/www/i", os.O_RDONLY, 0)
                break
            except FileNotFoundError:
                await asyncio.sleep(0.1)
        _, data = await files.call("read", handle, 0, 100)
        await files.call("close", handle)
        assert data == b"through-the-door\n"
        with pytest.raises(FileNotFoundError):
            await files.call("stat", str(host_only))
    finally:
        await files.close()
    foreign_info = await asyncio.to_thread(docker_client.api.inspect_container, foreign)
    with pytest.raises(EngineError, match="not a container of the agent"):
        await door.open_files(ContainerAt(foreign_info))


async def test_an_exec_is_signalled_and_hung_up_by_its_machines_agent(proxy, door, containers, docker_client) -> None:
    _, port = proxy
    managed, foreign = containers
    script = "trap 'echo got-int' INT; echo ready; while :; do sleep 0.1; done"
    exec_id = await door.exec_create(managed, ["sh", "-c", script], {})
    reader, writer = await door.exec_start(exec_id)
    try:
        await asyncio.wait_for(reader.readuntil(b"ready"), 10)
        assert await door.signal(exec_id, managed, signal.SIGINT)
        await asyncio.wait_for(reader.readuntil(b"got-int"), 10)
        writer.close()  # the session's end: the engine keeps the exec running...
        await asyncio.sleep(1)
        assert (await door.exec_inspect(exec_id))["Running"]
        await door.hang_up(exec_id, managed)  # ... until it is hung up
        assert await door.exec_exit_code(exec_id, 10) is not None  # ended: SIGHUP, which it does not trap
    finally:
        writer.close()
    status, text = await asyncio.to_thread(curl, port, "POST", f"/gpuhost/exec/{exec_id}/signal?number=999")
    assert status == 400 and "not a signal" in text
    foreign_exec = (await asyncio.to_thread(docker_client.api.exec_create, foreign, ["true"]))["Id"]
    for action in ("hangup", "signal?number=9"):
        assert (await asyncio.to_thread(curl, port, "POST", f"/gpuhost/exec/{foreign_exec}/{action}"))[0] == 403


HTTPS = (
    "mkdir -p /tmp && cd /tmp && openssl req -x509 -newkey rsa:2048 -nodes -keyout k.pem -out c.pem "
    "-subj /CN=origin -days 2 2>/dev/null && exec openssl s_server -quiet -accept 8443 -cert c.pem -key k.pem -www"
)


async def test_a_last_hop_speaks_tls_on_the_containers_machine_when_asked(door, containers, docker_client) -> None:
    """An insecure stack's tunnel on another machine: the worker speaks TLS to
    the service, unverified; the leader's dial fails as on one machine when
    the service is not listening yet or is not HTTPS."""
    managed, _ = containers
    secure = await asyncio.to_thread(
        docker_client.containers.run,
        TLS_IMAGE,
        ["sh", "-c", HTTPS],
        detach=True,
        labels={
            wire.LABEL_MANAGED: "true",
            "gpuhost-test": "door",
            "com.docker.compose.project": "door-test",
        },
        ports={"8443/tcp": None},
        network="door-test",  # the stack's network, made by the containers fixture
    )
    try:
        info = await asyncio.to_thread(docker_client.api.inspect_container, secure.id)
        address = next(iter(info["NetworkSettings"]["Networks"].values()))["IPAddress"]
        tls = ssl.create_default_context()  # the leader's context says "TLS"; the worker's own does not verify
        for _ in range(100):  # openssl making its key
            try:
                reader, writer = await door.dial(ContainerAt(info), address, 8443, tls=tls, timeout=10)
                break
            except ConnectionRefusedError:
                await asyncio.sleep(0.1)
        writer.write(b"GET / HTTP/1.0\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.0 200") and b"s_server" in answer, answer[:300]
        plain = await asyncio.to_thread(docker_client.api.inspect_container, managed)
        plain_address = next(iter(plain["NetworkSettings"]["Networks"].values()))["IPAddress"]
        with pytest.raises(ssl.SSLError, match="TLS handshake"):  # httpd speaks plain HTTP
            await door.dial(ContainerAt(plain), plain_address, 8080, tls=tls, timeout=10)
        with pytest.raises(ConnectionRefusedError):
            await door.dial(ContainerAt(plain), plain_address, 9000, tls=None, timeout=10)
    finally:
        await asyncio.to_thread(secure.remove, force=True)


async def test_the_engines_events_reach_the_leader_for_the_agents_containers_alone(
    door, containers, docker_client
) -> None:
    """The leader's follow of a machine's events (core/swarm/worker_events.py): the
    host's own container dies first, then one of the agent's with a renter's 700 KB
    of labels (one line over aiohttp's readline cap once ended the stream for every
    renter of that machine), then the agent's; the agent's are told, the stream goes on."""
    managed, unmanaged = containers
    bulky = await asyncio.to_thread(
        docker_client.containers.run,
        TEST_IMAGE,
        ["sleep", "600"],
        detach=True,
        labels={wire.LABEL_MANAGED: "true", "gpuhost-test": "door", "renter.notes": "A" * 700_000},
        healthcheck={"test": ["CMD", "true"], "interval": 10_000_000},  # 10 ms: exec events the door never asks for
    )
    seen: list[dict] = []
    follow = asyncio.create_task(door.follow_events(seen.append))
    try:
        await asyncio.sleep(1)  # the stream is open (events before it are not replayed)
        for container_id in (unmanaged, bulky.id, managed):
            await asyncio.to_thread(docker_client.api.kill, container_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while not any(e.get("Action") == "die" and e.get("id") == managed for e in seen):
            assert loop.time() < deadline and not follow.done(), seen
            await asyncio.sleep(0.1)
        # other tests' agent containers on this shared engine may speak too; the host's own never
        assert unmanaged not in {e.get("id") for e in seen} and {e.get("Type") for e in seen} == {"container"}
        print("LENS", [len(json.dumps(e)) for e in seen if e.get("id") == bulky.id])
        assert any(e.get("Action") == "die" and e.get("id") == bulky.id for e in seen)  # under the 1 MiB limit
        actions = {str(e.get("Action")).split(":")[0] for e in seen}
        assert actions <= set(wire.CONTAINER_EVENTS) and "health_status" in actions, actions  # no exec_* events
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)
        await asyncio.to_thread(bulky.remove, force=True)


async def _raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=TLS["door"].client())
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 20)
    writer.close()
    return answer


async def test_a_second_request_never_rides_an_approved_one_to_the_engine(proxy, containers, docker_client) -> None:
    """dockerd reads a bare LF as a line end: a header value holding one
    carried a whole `POST /containers/create` (privileged, / mounted) behind
    an approved exec. The door refuses such a head and writes its own."""
    _, port = proxy
    managed, _ = containers
    name = f"gpuhost-door-smuggled-{os.getpid()}"
    create = json.dumps({"Image": TEST_IMAGE, "Cmd": ["true"], "HostConfig": {"Privileged": True, "Binds": ["/:/h"]}})
    smuggled = (
        f"application/json\nContent-Length: 2\n\n{{}}POST /containers/create?name={name} HTTP/1.1\nHost: d\n"
        f"Content-Type: application/json\nContent-Length: {len(create)}\n\n{create}"
    )
    body = json.dumps({"Cmd": ["true"]})
    request = (
        f"POST /containers/{managed}/exec HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: {smuggled}\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    )
    try:
        answer = await _raw(port, request.encode())
        await asyncio.sleep(1)
        made = await asyncio.to_thread(docker_client.containers.list, all=True, filters={"name": name})
        assert made == [] and answer.startswith(b"HTTP/1.1 400"), answer[:200]
    finally:
        for container in await asyncio.to_thread(docker_client.containers.list, all=True, filters={"name": name}):
            await asyncio.to_thread(container.remove, force=True)


async def test_an_exec_is_never_privileged_whatever_case_its_keys_are_in(proxy, containers, docker_client) -> None:
    """The engine's Go decoder matches `privileged` to Privileged: the door
    reads the body so too and writes it again from the fields allowed."""
    _, port = proxy
    managed, _ = containers
    for body in ({"Cmd": ["id"], "privileged": True}, {"Cmd": ["id"], "pRiViLeGeD": True}):
        status, text = await asyncio.to_thread(curl, port, "POST", f"/containers/{managed}/exec", body=body)
        if status == 201:  # what the engine made of it
            made = await asyncio.to_thread(docker_client.api.exec_inspect, json.loads(text)["Id"])
            assert not made["ProcessConfig"]["privileged"], body
        assert status == 403 and "never privileged" in text, (body, text)
    status, text = await asyncio.to_thread(curl, port, "POST", f"/containers/{managed}/exec", body={"cmd": ["id"]})
    made = await asyncio.to_thread(docker_client.api.exec_inspect, json.loads(text)["Id"])
    assert status == 201 and made["ProcessConfig"]["entrypoint"] == "id" and not made["ProcessConfig"]["privileged"]


def _host_addresses() -> list[str]:
    """This machine's own global IPv4 addresses (its Swarm address among them on a real worker)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True)
    return [line.split()[3].split("/")[0] for line in out.stdout.splitlines()]


async def test_no_container_reaches_the_door_on_any_address_of_its_host(docker_client, door_tls) -> None:
    """The door as a worker serves it: on one address of the machine (not
    every one), and never to a peer inside one of the engine's networks.
    A container on a stack's network tries its gateway, the default
    bridge's and each address of the host, with the key: nothing answers."""
    from gpuhost_agent.runtime.engine.client import DockerEngine

    engine, local = DockerEngine(), EngineStreams()
    engine_path = parse_docker_host(os.environ.get("DOCKER_HOST")).unix_path
    assert engine_path
    bridges = {
        str(config.get("Gateway"))
        for network in await engine.swarm_list("networks")
        for config in (network.get("IPAM") or {}).get("Config") or []
    }
    addresses = [address for address in await asyncio.to_thread(_host_addresses) if address not in bridges]
    assert addresses, "no address of this machine outside Docker's bridges"

    async def networks() -> list[dict]:
        return await engine.swarm_list("networks")

    served = WorkerDoor(KEY, local, engine_path, networks=networks, tls=door_tls.server())
    port = await served.start(addresses[0], 0)
    network = await asyncio.to_thread(
        docker_client.networks.create, f"gpuhost-door-{os.getpid()}", labels={"gpuhost-test": "door"}
    )
    try:
        from_host = await _raw_to(addresses[0], port)
        assert from_host.startswith(b"HTTP/1.1 404"), from_host  # served: this door reports no machine
        await asyncio.to_thread(network.reload)
        gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
        request = f"GET /gpuhost/machine HTTP/1.1\\r\\nAuthorization: Bearer {KEY}\\r\\n\\r\\n"
        tries = " ".join([gateway, "172.17.0.1", *addresses])
        script = f"for a in {tries}; do echo try-$a; (printf '{request}'; sleep 2) | nc -w 3 $a {port}; done; echo end"
        out = await asyncio.to_thread(
            docker_client.containers.run, TEST_IMAGE, ["sh", "-c", script], network=network.name, remove=True
        )
        text = out.decode()
        assert "end" in text and "try-" + addresses[0] in text and "HTTP/1.1" not in text, text
    finally:
        await asyncio.to_thread(network.remove)
        await served.stop()
        await local.close()
        await engine.close()


async def _raw_to(host: str, port: int) -> bytes:
    reader, writer = await asyncio.open_connection(host, port, ssl=TLS["door"].client())
    writer.write(f"GET /gpuhost/machine HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def test_the_door_dials_no_address_outside_the_containers_stack_networks(door, docker_client) -> None:
    """The door judges the address as the leader does (streams/sandbox_addresses.py):
    an agent's container on no network of its stack (here the engine's default
    bridge, which every container may be put on) is not dialled, whatever port
    it declares."""
    outside = await asyncio.to_thread(
        docker_client.containers.run,
        TEST_IMAGE,
        ["sh", "-c", SERVE],
        detach=True,
        labels={wire.LABEL_MANAGED: "true", "gpuhost-test": "door"},
        ports={"8080/tcp": None},
    )
    try:
        info = await asyncio.to_thread(docker_client.api.inspect_container, outside.id)
        address = next(iter(info["NetworkSettings"]["Networks"].values()))["IPAddress"]
        with pytest.raises(EngineError, match="outside the networks"):
            await door.connect_through(outside.id, address, 8080)
    finally:
        await asyncio.to_thread(outside.remove, force=True)

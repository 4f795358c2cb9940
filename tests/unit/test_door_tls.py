"""The mutual TLS of the worker's door (service/swarm_tls.py, docs/swarm.md)
on real sockets: only the leader's certificate from the environment's CA
opens a door, plain HTTP gets nothing, the leader talks only to a worker's
certificate, a bundle is checked before it is installed, and the end of an
exec's stdin crosses TLS as a frame of its own (a half-close to the engine)."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path

import pytest
from support.door_tls import NODE, DoorTls, make_door_tls

from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.door_client import ANSWER_BYTES, DoorClient
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.errors import AnswerTooLarge, ContainerGone
from gpuhost_agent.service import swarm_tls
from gpuhost_agent.service.config import ConfigError
from gpuhost_agent.streams.door import WorkerDoor

KEY = "k" * 24


@pytest.fixture
def door_tls(tmp_path) -> DoorTls:
    """The environment's CA, the leader's and a worker's certificates (service/swarm_tls.py)."""
    return make_door_tls(tmp_path)


ID = "5e7140ba6f17c65a09300a61fbb9e36a520b40a8869c52175d0f97f718ab2a59"
ASK = f"GET /gpuhost/machine HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()


class _Engine:
    async def inspect(self, ident: str) -> dict:
        return {"Id": ident, "Config": {"Labels": {wire.LABEL_MANAGED: "true"}}, "State": {"Running": True}}

    async def exec_inspect(self, ident: str) -> dict:
        return {"ContainerID": ID}


@pytest.fixture
def other(tmp_path) -> DoorTls:
    """Another environment's CA and certificates."""
    base = tmp_path / "other"
    base.mkdir()
    return make_door_tls(base)


@pytest.fixture
def worker_as_client(door_tls) -> ssl.SSLContext:
    """A worker's certificate used as a client (one worker at another's door)."""
    context = ssl.create_default_context(cafile=str(door_tls.worker / swarm_tls.CA_CERT))
    context.check_hostname = False
    context.load_cert_chain(door_tls.worker / swarm_tls.CERT, door_tls.worker / swarm_tls.KEY)
    return context


@pytest.fixture
def no_certificate(door_tls) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(door_tls.worker / swarm_tls.CA_CERT))
    context.check_hostname = False
    return context


async def _ask(port: int, context: ssl.SSLContext | None) -> bytes:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        writer.write(ASK)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return answer
    except (ssl.SSLError, ConnectionError):
        return b""


async def test_only_the_leaders_certificate_opens_a_door(door_tls, other, worker_as_client, no_certificate) -> None:
    proxy = WorkerDoor(KEY, _Engine(), "/nonexistent", tls=door_tls.server())  # type: ignore[arg-type]
    port = await proxy.start("127.0.0.1", 0)
    try:
        assert (await _ask(port, door_tls.client())).startswith(b"HTTP/1.1 404")  # served (no machine report)
        assert await _ask(port, None) == b""  # plain HTTP: the key and the bytes in clear, never served
        assert await _ask(port, no_certificate) == b""
        assert await _ask(port, worker_as_client) == b""
        assert await _ask(port, other.client()) == b""  # another environment's leader
    finally:
        await proxy.stop()


async def test_the_leader_talks_only_to_a_workers_certificate_of_its_environment(door_tls, other) -> None:
    for impostor in (other.server(), swarm_tls_leader_as_server(door_tls)):
        proxy = WorkerDoor(KEY, _Engine(), "/nonexistent", tls=impostor)  # type: ignore[arg-type]
        port = await proxy.start("127.0.0.1", 0)
        door = DoorClient("127.0.0.1", port, KEY, door_tls.client())
        try:
            with pytest.raises(EngineError, match="SSL|certificate"):
                await door.machine(live=True)
        finally:
            await door.close()
            await proxy.stop()


def swarm_tls_leader_as_server(tls: DoorTls) -> ssl.SSLContext:
    """The leader's own certificate, served as if it were a door's."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls.leader / swarm_tls.CA_CERT))
    context.load_cert_chain(tls.leader / swarm_tls.CERT, tls.leader / swarm_tls.KEY)
    return context


def test_a_bundle_is_checked_before_a_worker_takes_it(door_tls, other, tmp_path) -> None:
    mixed = tmp_path / "mixed.pem"  # a worker's key and certificate with another environment's CA
    key_cert = swarm_tls.bundle(door_tls.leader, NODE).split(b"-----BEGIN CERTIFICATE-----")
    ca = (other.leader / swarm_tls.CA_CERT).read_bytes()
    mixed.write_bytes(key_cert[0] + b"-----BEGIN CERTIFICATE-----" + key_cert[1] + ca)
    with pytest.raises(ConfigError, match="not signed"):
        swarm_tls.install_worker(mixed, tmp_path / "w1")
    leader_bundle = tmp_path / "leader.pem"
    leader_bundle.write_bytes(
        (door_tls.leader / swarm_tls.KEY).read_bytes()
        + (door_tls.leader / swarm_tls.CERT).read_bytes()
        + (door_tls.leader / swarm_tls.CA_CERT).read_bytes()
    )
    with pytest.raises(ConfigError, match="not a worker's"):
        swarm_tls.install_worker(leader_bundle, tmp_path / "w2")
    with pytest.raises(ConfigError, match="not a Swarm worker's certificate"):
        swarm_tls.server_context(door_tls.leader)
    with pytest.raises(ConfigError, match="missing"):
        swarm_tls.client_context(tmp_path / "none")
    assert (door_tls.worker / swarm_tls.KEY).stat().st_mode & 0o777 == 0o600
    assert not (door_tls.worker / swarm_tls.CA_KEY).exists()  # the CA's key stays with the leader


def test_install_sh_runs_the_module_as_a_program(tmp_path) -> None:
    import sys

    run = [sys.executable, "-m", "gpuhost_agent.service.swarm_tls"]
    subprocess.run([*run, "leader", str(tmp_path / "l")], check=True, timeout=60)
    subprocess.run([*run, "bundle", str(tmp_path / "l"), str(tmp_path / "b.pem"), NODE], check=True, timeout=60)
    subprocess.run([*run, "worker", str(tmp_path / "b.pem"), str(tmp_path / "w"), NODE], check=True, timeout=60)
    revoked = subprocess.run([*run, "revoke", str(tmp_path / "l"), NODE], capture_output=True, text=True, timeout=60)
    assert revoked.returncode == 0 and revoked.stdout.strip(), revoked.stderr
    assert (tmp_path / "b.pem").stat().st_mode & 0o777 == 0o600
    swarm_tls.server_context(tmp_path / "w")
    swarm_tls.client_context(tmp_path / "l")
    bad = subprocess.run([*run, "worker", str(tmp_path / "l" / "cert.pem"), str(tmp_path / "x")], timeout=60)
    assert bad.returncode == 1


async def test_the_end_of_an_execs_stdin_crosses_tls_as_a_half_close_to_the_engine(door_tls, tmp_path) -> None:
    """`ssh host wc -c < file`: the leader ends the input with write_eof, which
    TLS cannot send; the door half-closes the engine's side on its frame."""
    got = bytearray()
    ended = asyncio.Event()

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        assert json.loads(await reader.readexactly(length)) == {"Detach": False, "Tty": False}
        writer.write(b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
        while chunk := await reader.read(65536):
            got.extend(chunk)
        ended.set()  # the exec's stdin closed: it answers and ends
        writer.write(f"count-{len(got)}".encode())
        await writer.drain()
        writer.close()

    path = str(tmp_path / "engine.sock")
    server = await asyncio.start_unix_server(engine, path)
    proxy = WorkerDoor(KEY, _Engine(), path, tls=door_tls.server())  # type: ignore[arg-type]
    port = await proxy.start("127.0.0.1", 0)
    door = DoorClient("127.0.0.1", port, KEY, door_tls.client())
    try:
        reader, writer = await door.exec_start(ID, tty=False)
        data = bytes(range(256)) * 1000  # more than one frame
        writer.write(data)
        await writer.drain()
        assert writer.can_write_eof()
        writer.write_eof()
        await asyncio.wait_for(ended.wait(), 10)
        assert bytes(got) == data
        assert await asyncio.wait_for(reader.read(), 10) == f"count-{len(data)}".encode()
        writer.close()
    finally:
        await door.close()
        await proxy.stop()
        server.close()
        await server.wait_closed()
    assert proxy.served == 1


async def test_an_answer_through_the_door_is_read_only_up_to_its_cap(door_tls) -> None:
    """The leader read a door's answer whole (a 64 MiB machine report took
    it from 47 to 300 MiB). A worker answering without end is read up to ANSWER_BYTES, then
    refused; what it managed to send shows the leader stopped reading."""
    sent = [0]

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{"pad": "')
        try:
            for _ in range(4 * ANSWER_BYTES // 65536):
                writer.write(b"a" * 65536)
                await writer.drain()
                sent[0] += 65536
            writer.write(b'"}')
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(endless, "127.0.0.1", 0, ssl=door_tls.server())
    port = server.sockets[0].getsockname()[1]
    door = DoorClient("127.0.0.1", port, KEY, door_tls.client())
    try:
        with pytest.raises(AnswerTooLarge, match="over"):
            await door.machine(live=True)
    finally:
        await door.close()
        server.close()
        await server.wait_closed()
    assert sent[0] < 2 * ANSWER_BYTES, sent


async def _stalled(port: int, source: str) -> asyncio.StreamWriter:
    """A plain connection from `source` that never starts its TLS handshake."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    return writer


async def _closed_at_once(port: int, source: str) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        return await asyncio.wait_for(reader.read(1), 2) == b""
    except asyncio.TimeoutError:
        return False
    finally:
        writer.close()


async def test_connections_are_capped_per_source_and_handshakes_at_once_before_tls(door_tls) -> None:
    """A handshake costs the worker CPU whoever asks, so the caps
    count the plain connection before TLS begins: one address stalling handshakes
    gets no more, nor do many together. The leader's address (a Swarm manager's)
    has a pool of its own, which no flood uses up, and takes its bursts (the red
    team saw the leader's own 16 connections at once cut to 4)."""
    from gpuhost_agent.streams import door as door_module

    if not door_module.TLS_AFTER_ACCEPT:
        pytest.skip("Python 3.10: TLS at the accept, the caps count after it")

    async def managers() -> frozenset[str]:
        return frozenset({"127.0.0.2"})

    proxy = WorkerDoor(KEY, _Engine(), "/nonexistent", tls=door_tls.server(), leaders=managers)  # type: ignore[arg-type]
    port = await proxy.start("127.0.0.1", 0)
    held: list[asyncio.StreamWriter] = []

    async def leader_asks() -> bytes:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=door_tls.client(), local_addr=("127.0.0.2", 0)
        )
        writer.write(ASK)
        try:
            return await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()

    try:
        held += [await _stalled(port, "127.0.0.9") for _ in range(door_module.HANDSHAKES_PER_SOURCE)]
        await asyncio.sleep(0.2)
        assert await _closed_at_once(port, "127.0.0.9")  # its fifth: closed before any byte
        # Many addresses together: at most HANDSHAKES_AT_ONCE in flight, whoever holds them.
        sources = [f"127.0.1.{n}" for n in range(door_module.HANDSHAKES_AT_ONCE)]
        held += [await _stalled(port, source) for source in sources[: door_module.HANDSHAKES_AT_ONCE - len(held)]]
        await asyncio.sleep(0.2)
        assert await _closed_at_once(port, "127.0.2.1")
        assert proxy.capped == 2
        # The leader, meanwhile: served, sixteen at once.
        answers = await asyncio.gather(*(leader_asks() for _ in range(16)))
        assert all(answer.startswith(b"HTTP/1.1 404") for answer in answers), answers
        for writer in held:  # gone: admitted again
            writer.close()
        held.clear()
        await asyncio.sleep(0.2)
        assert (await _ask(port, door_tls.client())).startswith(b"HTTP/1.1 404")
    finally:
        for writer in held:
            writer.close()
        await proxy.stop()


async def test_a_flood_of_connections_waits_on_no_engine_call_and_is_counted_at_once(door_tls) -> None:
    """Each connection asked the engine for the Swarm's managers
    before any cap counted it (400 connections, 400 calls, none counted). Now the
    managers are read once at the start and again by one task in the background."""
    from gpuhost_agent.streams import door as door_module

    calls = 0

    async def managers() -> frozenset[str]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.5)  # a busy engine
        return frozenset({"127.0.0.2"})

    proxy = WorkerDoor(KEY, _Engine(), "/nonexistent", tls=door_tls.server(), leaders=managers)  # type: ignore[arg-type]
    port = await proxy.start("127.0.0.1", 0)
    proxy._leaders = (float("-inf"), proxy._leaders[1])  # stale from now on
    writers = []
    try:
        for _ in range(100):
            writers.append((await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.9", 0)))[1])
        await asyncio.sleep(0.3)
        assert calls == 2  # the start's, and one read for the whole flood
        counted = sum(proxy._open_by.values())
        if door_module.TLS_AFTER_ACCEPT:
            assert counted == door_module.HANDSHAKES_PER_SOURCE, counted
            assert proxy.capped == 100 - counted, proxy.capped
    finally:
        for writer in writers:
            writer.close()
        await proxy.stop()


async def test_a_failed_read_of_the_leaders_keeps_the_last_ones_known(door_tls) -> None:
    """One engine timeout put the leader in the common pool for 30 s."""
    answers = [frozenset({"127.0.0.2"})]

    async def managers() -> frozenset[str]:
        if not answers:
            raise TimeoutError("the engine is slow")
        return answers.pop()

    proxy = WorkerDoor(KEY, _Engine(), "/nonexistent", tls=door_tls.server(), leaders=managers)  # type: ignore[arg-type]
    await proxy.start("127.0.0.1", 0)
    try:
        await proxy._read_leaders()  # fails
        assert proxy._from_leader("127.0.0.2")
    finally:
        await proxy.stop()


async def _machine_through(port: int, context: ssl.SSLContext, node: str | None, crl: str | None = None) -> str:
    """What the leader's door client gets asking `node`'s door: "served", or the refusal."""
    door = DoorClient("127.0.0.1", port, KEY, context, node, crl)
    try:
        await door.machine(live=True)
        return "served"
    except ContainerGone:  # the stand-in engine behind the door has no such path: the door let it through
        return "served"
    except EngineError as exc:  # its message names the port, which may hold any digits
        return str(exc)
    finally:
        await door.close()


async def test_a_door_client_closed_leaves_no_connection_open(door_tls) -> None:
    """The leader closes each door's client at its stop: its HTTP session (and the
    TLS connections it pooled) goes with it."""
    proxy = WorkerDoor(KEY, _Engine(), "/nonexistent", tls=door_tls.server())  # type: ignore[arg-type]
    port = await proxy.start("127.0.0.1", 0)
    try:
        door = DoorClient("127.0.0.1", port, KEY, door_tls.checked_client(), NODE)
        with pytest.raises(ContainerGone):
            await door.machine(live=True)
        session = door._session()
        await door.close()
        assert session.closed
    finally:
        await proxy.stop()


async def test_the_leader_talks_to_a_door_only_as_the_node_it_dials_and_never_to_a_revoked_one(
    door_tls, tmp_path
) -> None:
    """A worker's certificate names its Swarm node, the leader asks the
    door it dials for that node (one worker's certificate cannot stand in for another
    machine's door), and a retired worker is revoked without a new CA."""
    proxy = WorkerDoor(KEY, _Engine(), "/nonexistent", tls=door_tls.server())  # type: ignore[arg-type]
    port = await proxy.start("127.0.0.1", 0)
    try:
        assert await _machine_through(port, door_tls.checked_client(), NODE) == "served"
        other_node = "othernode000000000000000003"
        refused = await _machine_through(port, door_tls.checked_client(), other_node)
        assert "certificate" in refused and "mismatch" in refused.lower(), refused
        # Revoked: the CA's list names every certificate made for the node; the leader reads it at start.
        assert await asyncio.to_thread(swarm_tls.revoke, door_tls.leader, NODE)  # retired
        revoked_context = await asyncio.to_thread(swarm_tls.client_context, door_tls.leader)
        refused = await _machine_through(port, revoked_context, NODE)
        assert "revoked" in refused, refused
    finally:
        await proxy.stop()
    with pytest.raises(ConfigError, match="no certificate of this CA names node"):
        await asyncio.to_thread(swarm_tls.revoke, door_tls.leader, "neverissued00000000000000")


def test_certificates_last_a_year_name_their_node_and_doctor_sees_their_end(door_tls, tmp_path) -> None:
    import datetime

    from cryptography import x509

    for directory in (door_tls.leader, door_tls.worker):
        cert = x509.load_pem_x509_certificate((directory / swarm_tls.CERT).read_bytes())
        assert cert.not_valid_after_utc - cert.not_valid_before_utc <= datetime.timedelta(days=366)
    worker = x509.load_pem_x509_certificate((door_tls.worker / swarm_tls.CERT).read_bytes())
    names = worker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [f"{NODE}.node.gpuhost.invalid"]
    # A bundle made for another machine is refused by the worker it is not for.
    elsewhere = tmp_path / "elsewhere.pem"
    elsewhere.write_bytes(swarm_tls.bundle(door_tls.leader, "othernode000000000000000003"))
    with pytest.raises(ConfigError, match="made for node"):
        swarm_tls.install_worker(elsewhere, tmp_path / "w3", NODE)
    with pytest.raises(ConfigError, match="names its Swarm node id"):
        swarm_tls.bundle(door_tls.leader, "")
    ends = swarm_tls.expires(door_tls.worker)
    assert swarm_tls.expiry_problem(door_tls.worker) is None
    soon = swarm_tls.expiry_problem(door_tls.worker, ends - datetime.timedelta(days=10))
    assert soon is not None and ("ends in 9 day(s)" in soon or "ends in 10 day(s)" in soon), soon
    assert "ended" in (swarm_tls.expiry_problem(door_tls.worker, ends + datetime.timedelta(days=1)) or "")
    watched = swarm_tls.doctor_check("worker", door_tls.worker)  # what doctor adds on a Swarm machine
    assert watched["ok"] and watched["summary"].startswith("this machine's Swarm certificate is valid until")
    assert not swarm_tls.doctor_check("worker", tmp_path / "none")["ok"]


def test_the_leaders_address_is_read_from_the_managers_addr() -> None:
    from gpuhost_agent.service.swarm_worker import manager_host

    assert manager_host("100.77.0.11:2377") == "100.77.0.11"
    assert manager_host("[fd00::11]:2377") == "fd00::11"


def test_a_bundle_written_to_a_shared_folder_goes_through_no_file_a_local_user_planted(door_tls) -> None:
    """`bundle` wrote through `.<name>.new`, opened without O_EXCL: a local user who
    made that name first (world-readable, theirs) got the worker's key. Now a new file of a random name."""
    shared = Path(tempfile.mkdtemp(dir="/tmp"))  # reachable by another user, as /tmp is
    try:
        shared.chmod(0o1777)
        planted = shared / ".worker.pem.new"
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        subprocess.run([*nobody, "sh", "-c", f"umask 000; : > {planted}"], check=True)
        swarm_tls.main(["bundle", str(door_tls.leader), str(shared / "worker.pem"), NODE])
        written = shared / "worker.pem"
        assert written.stat().st_uid == 0 and written.stat().st_mode & 0o777 == 0o600
        assert planted.read_bytes() == b""  # the planted file got nothing
        assert b"PRIVATE KEY" in written.read_bytes()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


async def test_a_certificate_the_leader_had_before_opens_no_door_once_the_leader_has_spoken(door_tls, other) -> None:
    """A leader's certificate replaced by a new install (the
    machine lost, its key copied) still opened every door until the CA was replaced. The install
    revokes it in the CA's list, the leader sends the list with its requests, and a worker takes a
    newer one signed by its CA (never another CA's, never an older one)."""
    from functools import partial

    from gpuhost_agent.service.swarm_worker import _newer_crl

    stolen = door_tls.leader.parent / "stolen"
    await asyncio.to_thread(shutil.copytree, door_tls.leader, stolen)
    old_leader = await asyncio.to_thread(swarm_tls.client_context, stolen, node_checked=False)
    before = await asyncio.to_thread(swarm_tls.crl_header, door_tls.leader)
    await asyncio.to_thread(swarm_tls.install_leader, door_tls.leader)  # the leader installed again
    new_leader = await asyncio.to_thread(swarm_tls.client_context, door_tls.leader, node_checked=False)
    listed = await asyncio.to_thread(swarm_tls.crl_header, door_tls.leader)
    foreign = await asyncio.to_thread(swarm_tls.crl_header, other.leader)
    worker = await asyncio.to_thread(swarm_tls.server_context, door_tls.worker)
    take = partial(_newer_crl, door_tls.worker)
    door = WorkerDoor(KEY, _Engine(), "/nonexistent", tls=worker, crl=take)  # type: ignore[arg-type]
    port = await door.start("127.0.0.1", 0)
    try:
        assert (await _ask(port, old_leader)).startswith(b"HTTP/1.1 404")  # the worker has not heard yet
        for ignored in (foreign, before, "not base64!"):  # another CA's, an older one, garbage
            asked = ASK.replace(b"\r\n\r\n", f"\r\nX-Gpuhost-Crl: {ignored}\r\n\r\n".encode())
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=new_leader)
            writer.write(asked)
            await asyncio.wait_for(reader.read(), 10)
            writer.close()
        assert (await _ask(port, old_leader)).startswith(b"HTTP/1.1 404")
        assert await _machine_through(port, new_leader, None, listed) == "served"
        assert await _ask(port, old_leader) == b""  # refused at the handshake: revoked
        assert (await _ask(port, new_leader)).startswith(b"HTTP/1.1 404")
    finally:
        await door.stop()
    # A worker installed from a bundle made after the leader's new install holds the list from the start.
    made = await asyncio.to_thread(swarm_tls.bundle, door_tls.leader, NODE)
    assert made.count(b"-----BEGIN X509 CRL-----") == 1

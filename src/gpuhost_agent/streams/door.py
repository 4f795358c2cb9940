"""The worker's door for the leader (GPUHOST_SWARM=worker, docs/swarm.md).

In a Swarm environment the leader holds the marketplace session, but a
terminal, an SSH session, SFTP and a tunnel need the machine that runs the
container: its engine, its pids, its network namespaces. So the agent on
each other machine serves the leader a narrow part of its engine's API,
three things of its own, and nothing else:

- a container's inspect and log, an exec created in it, and that exec's
  start (the TTY, both ways), resize and inspect;
- a tunnel's last hop (`POST /gpuhost/containers/{id}/connect?address=&port=`:
  a connection made from inside the container's network namespace,
  runtime/netns_dial.py, to one of its own addresses on a port it declares,
  then bytes both ways, as on one machine: streams/tunnel.py);
- SFTP's file helper (`POST /gpuhost/containers/{id}/files`: started here,
  confined to the container, runtime/container_files.py; its frames relayed
  both ways);
- an exec's hang-up and an SSH client's signal to it
  (`POST /gpuhost/exec/{id}/hangup`, `.../signal?number=`), done here under
  the pid-namespace rule of runtime/exec_hangup.py;
- this machine's own report (`GET /gpuhost/machine`: its systemData and its
  GPUs' live figures, or with `?live=1` the figures alone,
  inventory/machine_report.py);
- the rentals' use of this machine's disk (`GET /gpuhost/disk`: the agent's
  containers' writable layers and the stacks' volumes, for the leader's
  disk watch, core/disk_watch.py);
- the engine's container events (`GET /events`, asked of the engine for the
  agent's containers alone whatever the query, core/swarm/worker_events.py);
- every other path is 403;
- only containers the agent manages (label io.gpuhost.managed=true): the
  host's own containers and anything else on the engine are out of reach;
- an exec never privileged, whatever the body asks, in any case of its keys
  (the body is written again from the fields allowed, streams/door_request.py);
- only over mutual TLS with the leader's certificate from the environment's
  CA (service/swarm_tls.py), and with the environment's key
  (`Authorization: Bearer <GPUHOST_SWARM_KEY>`, compared in constant time),
  401 otherwise; never to a peer inside one of the engine's networks (a
  container of this machine), closed unread.

One request per connection: the request is read whole (head, then a body of
its Content-Length, at most 64 KiB), checked, and rebuilt for the engine
from the checked values alone, with `Connection: close`
(streams/door_request.py: no client byte reaches the engine's head); the engine's answer is relayed and the connection
closed. An exec start asks for the raw stream (`Upgrade: tcp`): only then
are bytes relayed both ways after the request, as the engine hands over
the exec's TTY (and likewise for a tunnel or a file session); the leader's
bytes then come in frames, whose empty one is the end of its input (TLS
cannot half-close: runtime/door_client.py). So a second request can never
ride an approved one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import ssl
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.container_files import end_helper, start_helper
from gpuhost_agent.runtime.door_client import CRL_HEADER, FRAME_HEADER, FRAME_LIMIT, SERVICE_NO_TLS, SERVICE_REFUSED
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.records import DiskUsage
from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.runtime.netns_dial import dial_in_namespace
from gpuhost_agent.streams.door_own_calls import MachineSource, act
from gpuhost_agent.streams.door_request import body_length, engine_body, engine_target, parse_head
from gpuhost_agent.streams.door_routes import (
    EXEC_IDS,
    Approved,
    DoorRefused,
    dial_target,
    events_head,
    from_container,
    route,
)
from gpuhost_agent.streams.tunnel import CONNECT_TIMEOUT, address_judge

log = get_logger(__name__)

HEAD_LIMIT = 16 * 1024
BODY_LIMIT = 64 * 1024
CHUNK = 64 * 1024
READ_SECONDS = 10.0
# Counted on the plain connection, before its TLS handshake (a handshake costs the
# worker CPU whoever asks): a flood from one address, or from many, cannot starve
# the leader's own. The leader holds many at once (events, execs, tunnels).
# The leader's address (the Swarm's managers, or the door's own on one machine
# for trying it) has a pool of its own, which no other address can use up: the
# leader opens a connection per tunnel hop, exec and file session, in bursts.
HANDSHAKES_AT_ONCE = 32  # TLS handshakes in flight, every other source together
HANDSHAKES_PER_SOURCE = 4  # in flight from one other address
LEADER_HANDSHAKES = 128  # in flight from the leader's address
OPEN_PER_SOURCE = 512  # connections one address holds open
OPEN_FROM_LEADER = 4096
LEADERS_SECONDS = 30.0  # how long the managers' addresses, read from the engine, are kept
# Python 3.10's streams cannot start TLS on an accepted connection: there the
# handshake comes first, at the accept, and the caps count it after.
TLS_AFTER_ACCEPT = hasattr(asyncio.StreamWriter, "start_tls")


class WorkerDoor:
    def __init__(
        self,
        key: str,
        engine: EngineStreams,
        engine_path: str,
        machine: MachineSource | None = None,
        disk: Callable[[], Awaitable[DiskUsage]] | None = None,
        networks: Callable[[], Awaitable[list[dict]]] | None = None,
        *,
        tls: ssl.SSLContext,
        leaders: Callable[[], Awaitable[frozenset[str]]] | None = None,
        crl: Callable[[str], ssl.SSLContext | None] | None = None,
    ):
        """`leaders`: the addresses the leader's connections come from (the
        Swarm's managers, read from this machine's engine). `crl`: takes the
        revocation list a leader's request carries, and gives the context to
        hand out from then on when it was newer (service/swarm_tls.py)."""
        if len(key) < 16:
            raise ValueError("the environment's key must have at least 16 characters")
        self._expected = f"Bearer {key}".encode()
        self.engine, self.engine_path = engine, engine_path  # the local engine's socket
        self._machine, self._disk = machine, disk
        self._networks = networks  # the engine's networks: a peer in one is a container, never served
        self._tls = tls  # the worker's certificate; the leader's asked of every client (service/swarm_tls.py)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()  # ended by stop(): an event stream never ends by itself
        self._open_by: dict[str, int] = {}  # connections open, by source address
        self._handshaking: dict[str, int] = {}  # TLS handshakes in flight, by source address
        self._leaders_of = leaders
        self._take_crl, self._crl_seen = crl, ""
        self._leaders: tuple[float, frozenset[str]] = (float("-inf"), frozenset())  # (read at, addresses)
        self._reading: asyncio.Task | None = None  # the one read of the leaders' addresses in flight
        self._own = ""  # the address the door listens on: on one machine, the leader's own
        self.served = self.refused = self.capped = 0  # for tests and the status

    async def start(self, host: str, port: int) -> int:
        self._own = host
        if self._leaders_of is not None:  # known before the first connection: the leader's come in its own pool
            await self._read_leaders()
        if TLS_AFTER_ACCEPT:
            self._server = await asyncio.start_server(self._handle, host, port, limit=HEAD_LIMIT)
        else:
            self._server = await asyncio.start_server(
                self._handle, host, port, limit=HEAD_LIMIT, ssl=self._tls, ssl_handshake_timeout=READ_SECONDS
            )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """No new connection, and the open ones ended (the leader's event
        stream is always one): a stop is bounded whatever the leader holds."""
        if self._reading is not None:
            self._reading.cancel()
        if self._server is not None:
            self._server.close()
            for task in self._connections:
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection, until its far side ends it or the door stops. A
        stop's cancellation ends it here, quietly: the task must not end
        cancelled, since Python 3.11's start_server reads a finished
        connection's task.exception(), which raises for a cancelled one and
        is logged as an error with its traceback, on every normal stop."""
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        source = str(peer[0]) if peer else ""
        if not self._admitted(source, self._from_leader(source)):
            self.capped += 1
            if self.capped in (1, 10, 100) or self.capped % 1000 == 0:  # a flood is said, not logged line by line
                log.warning("swarm_door_connection_capped", source=source, capped=self.capped)
            writer.close()
            return
        self._connections.add(task)
        self._open_by[source] = self._open_by.get(source, 0) + 1
        try:
            if TLS_AFTER_ACCEPT and not await self._handshake(writer, source):
                writer.close()
                return
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            writer.close()
        finally:
            self._connections.discard(task)
            _less(self._open_by, source)

    def _admitted(self, source: str, leader: bool) -> bool:
        """Within the caps, counted before any byte is read or TLS begins: the
        leader's address in a pool of its own, every other in theirs."""
        if leader:
            return (
                self._open_by.get(source, 0) < OPEN_FROM_LEADER and self._handshaking.get(source, 0) < LEADER_HANDSHAKES
            )
        leaders = {*self._leaders[1], self._own}
        others = sum(count for address, count in self._handshaking.items() if address not in leaders)
        return (
            self._open_by.get(source, 0) < OPEN_PER_SOURCE
            and self._handshaking.get(source, 0) < HANDSHAKES_PER_SOURCE
            and others < HANDSHAKES_AT_ONCE
        )

    def _from_leader(self, source: str) -> bool:
        """Whether `source` is the leader's address: a Swarm manager's (read from
        the engine, kept LEADERS_SECONDS), or the door's own when it listens there.
        Judged on what is known now, never awaited: a stale set is read again by
        one task in the background, however many connections come meanwhile (a
        flood must not wait on the engine, one call each)."""
        if source and source == self._own:
            return True
        read_at, addresses = self._leaders
        stale = asyncio.get_running_loop().time() - read_at > LEADERS_SECONDS
        if stale and self._leaders_of is not None and (self._reading is None or self._reading.done()):
            self._reading = asyncio.create_task(self._read_leaders(), name="door-leaders")
        return source in addresses

    async def _read_leaders(self) -> None:
        """The managers' addresses read again; a failed read keeps the last ones
        known (a slow engine must not put the leader in the common pool a flood
        fills) and is tried again after a tenth of LEADERS_SECONDS."""
        assert self._leaders_of is not None
        now = asyncio.get_running_loop().time
        try:
            addresses = await asyncio.wait_for(self._leaders_of(), READ_SECONDS)
        except Exception as exc:  # no engine: the last addresses known stand (none at the start)
            log.warning("swarm_door_leaders_unknown", error=f"{type(exc).__name__}: {exc}"[:300])
            self._leaders = (now() - LEADERS_SECONDS * 0.9, self._leaders[1])
            return
        self._leaders = (now(), addresses)

    async def _handshake(self, writer: asyncio.StreamWriter, source: str) -> bool:
        """TLS on the accepted connection, within READ_SECONDS; whether it holds."""
        self._handshaking[source] = self._handshaking.get(source, 0) + 1
        try:
            await writer.start_tls(self._tls, ssl_handshake_timeout=READ_SECONDS)  # type: ignore[attr-defined]
            return True
        except (OSError, asyncio.TimeoutError, ValueError):  # ssl.SSLError is an OSError
            return False
        finally:
            _less(self._handshaking, source)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not await self._peer_allowed(writer):
            self.refused += 1
            writer.close()
            return
        try:
            approved = await self._request(reader)
            if approved.what in ("hangup", "signal", "machine", "disk"):
                answer = await act(approved, self.engine, self._machine, self._disk)
                if approved.what in ("hangup", "signal"):
                    log.info("swarm_door_done", what=approved.what, exec_id=approved.ident[:12], **answer)
                self.served += 1
                _answer(writer, 200, "OK", answer)
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                writer.close()
                return
            upstream_reader, upstream, done = await self._open(approved)
        except DoorRefused as exc:
            self.refused += 1
            _answer(writer, exc.status, "Refused", {"message": str(exc)})
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
            return
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError):
            writer.close()
            return
        self.served += 1
        if approved.what in ("connect", "files"):
            log.info("swarm_door_opened", what=approved.what, container_id=approved.ident[:12])
            writer.write(b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
        else:
            upstream.write(approved.head + approved.body)
        # The far side decides the end: the engine's answer is over, the exec or the helper ended.
        up = asyncio.create_task(_relay_frames(reader, upstream)) if approved.upgrade else None
        try:
            await _relay(upstream_reader, writer)
        finally:
            if up is not None:
                up.cancel()
                await asyncio.gather(up, return_exceptions=True)
            upstream.close()
            writer.close()
            await done()

    async def _peer_allowed(self, writer: asyncio.StreamWriter) -> bool:
        """Not from a container of this machine (closed at once, nothing read)."""
        if self._networks is None:
            return True
        peer = writer.get_extra_info("peername")
        try:
            networks = await self._networks()
        except Exception as exc:  # no engine, no door: refused rather than served unchecked
            log.warning("swarm_door_networks_unknown", error=f"{type(exc).__name__}: {exc}"[:300])
            return False
        return not from_container(str(peer[0]) if peer else "", networks)

    async def _open(
        self, approved: Approved
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Callable[[], Awaitable[None]]]:
        """The far side of an approved request: the engine's socket, a tunnel's
        service, or a file helper; and what ends it."""
        if approved.what == "files":
            state, config = approved.info.get("State") or {}, approved.info.get("Config") or {}
            try:
                helper = await start_helper(int(state.get("Pid") or 0), str(config.get("User") or ""), approved.ident)
            except OSError as exc:
                raise DoorRefused(503, f"no file session: {exc}"[:300]) from None
            assert helper.stdout is not None and helper.stdin is not None
            return helper.stdout, helper.stdin, partial(end_helper, helper)
        if approved.what == "connect":
            pid, address, port, tls = dial_target(approved)
            problem = (await address_judge(approved.info, self.engine.network))(address)
            if problem:  # the leader judged it too: this machine's engine and addresses say the same
                raise DoorRefused(403, problem)
            try:
                upstream_reader, upstream = await dial_in_namespace(
                    pid, address, port, CONNECT_TIMEOUT, tls, container_id=approved.ident
                )
            except ConnectionRefusedError as exc:
                raise DoorRefused(503, f"{SERVICE_REFUSED}: {exc}"[:300]) from None
            except ssl.SSLError as exc:
                raise DoorRefused(502, f"{SERVICE_NO_TLS}: {exc}"[:300]) from None
            except (OSError, asyncio.TimeoutError) as exc:
                raise DoorRefused(503, f"cannot reach the service: {type(exc).__name__}: {exc}"[:300]) from None
        else:
            upstream_reader, upstream = await asyncio.open_unix_connection(self.engine_path, limit=CHUNK)
        return upstream_reader, upstream, _nothing

    async def _request(self, reader: asyncio.StreamReader) -> Approved:
        """The checked request, and for the engine's routes its head and body
        as the engine gets them."""
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_SECONDS)
        method, target, headers = parse_head(raw)
        if not hmac.compare_digest(headers.get("authorization", "").encode(), self._expected):
            raise DoorRefused(401, "the environment's key is missing or wrong")
        listed = headers.get(CRL_HEADER.lower(), "")
        if listed and listed != self._crl_seen and self._take_crl is not None:
            self._crl_seen = listed  # judged once: a leader sends the same list with every request
            if (context := await asyncio.to_thread(self._take_crl, listed)) is not None:
                self._tls = context  # every handshake from now on checks the leader's list
                log.info("swarm_door_revocations_taken")
        allowed = route(method, target)
        if allowed is None:
            raise DoorRefused(403, f"{method} {target.split('?', 1)[0][:100]} is not served to the leader")
        length = body_length(headers, BODY_LIMIT)
        body = await asyncio.wait_for(reader.readexactly(length), READ_SECONDS) if length else b""
        what, ident = allowed
        if what in ("machine", "disk"):
            return Approved(what, ident, target, {})
        if what == "events":  # the engine's answer relayed as it streams, like a log
            return Approved(what, ident, target, {}, head=events_head())
        info = await self._check(what, ident)
        if what in ("connect", "files", "hangup", "signal"):
            if what == "files" and not (info.get("State") or {}).get("Running"):
                raise DoorRefused(503, "the container is not running")
            return Approved(what, ident, target, info, upgrade=what != "hangup" and what != "signal")
        path = target.split("?", 1)[0]
        upgrade = what == "exec" and path.endswith("/start")
        kind = next((k for k in ("logs", "resize", "start") if path.endswith(f"/{k}")), "")
        body = engine_body("create" if path.endswith("/exec") else kind, body)
        head = [f"{method} {engine_target(kind, target)} HTTP/1.1", "Host: docker"]
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        head += ["Connection: Upgrade", "Upgrade: tcp"] if upgrade else ["Connection: close"]
        return Approved(what, ident, target, info, upgrade, ("\r\n".join(head) + "\r\n\r\n").encode(), body)

    async def _check(self, what: str, ident: str) -> dict:
        try:
            if what in EXEC_IDS:
                ident = str((await self.engine.exec_inspect(ident)).get("ContainerID") or "")
            info = await self.engine.inspect(ident)
        except EngineError as exc:
            raise DoorRefused(404, f"not found: {exc}"[:300]) from None
        labels = (info.get("Config") or {}).get("Labels") or {}
        if labels.get(wire.LABEL_MANAGED) != "true":
            raise DoorRefused(403, "not a container of the agent")
        return info


def _answer(writer: asyncio.StreamWriter, status: int, reason: str, payload: Mapping[str, Any]) -> None:
    body = json.dumps(payload).encode()
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )


async def _nothing() -> None:
    return None


async def _relay(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Bytes as they come, with backpressure, until the source ends; then a
    half-close of the sink (a TTY's end of input)."""
    try:
        while chunk := await source.read(CHUNK):
            sink.write(chunk)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (ConnectionError, OSError):
        pass


async def _relay_frames(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """The leader's bytes after an upgrade, in frames (runtime/door_client.py):
    TLS cannot half-close, so the end of the leader's input (an exec's stdin,
    `ssh host wc -c < file`) is a frame of its own, here a half-close of the
    sink. The source's end without it ends the input too."""
    try:
        while True:
            length = int.from_bytes(await source.readexactly(FRAME_HEADER), "big")
            if length == 0 or length > FRAME_LIMIT:
                break
            sink.write(await source.readexactly(length))
            await sink.drain()
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    with contextlib.suppress(ConnectionError, OSError):
        if sink.can_write_eof():
            sink.write_eof()


def _less(counts: dict[str, int], source: str) -> None:
    """One fewer for `source`; none kept at zero (the map holds live sources only)."""
    left = counts.get(source, 0) - 1
    if left > 0:
        counts[source] = left
    else:
        counts.pop(source, None)

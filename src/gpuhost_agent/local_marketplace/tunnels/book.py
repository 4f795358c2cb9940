"""The tunnels of the rentals' stacks: one loopback listener per TCP port a
running container declares, while its stack is APPLIED and its rental active.

Each connection to a listener becomes a `tunnel` stream through the agent's
channel (tunnel_relay.py), so the service is reached over connections the
agent opened, with nothing opened on the host. The book follows the container
lists the agent reports: a port that appears gets a listener, one that goes
(container removed, stack removed, rental ended) loses it. A container that
restarts keeps its tunnel: the agent looks its address up for each connection.

Which tunnels are `http`: the ports web services use by convention (below),
and every port of a stack with basic auth, so that none of its ports is
reached ungated (a second Jupyter on 8889); such a port speaks HTTP or is
refused (its raw TCP is the SSH endpoint's to forward).
An `http` tunnel is the same byte relay but for the head of each
connection's first request, which it reads (bounded, as the gate does) to
strip the tunnels' session cookies, every tunnel's, before any container sees
one (tunnel_auth.py); it differs too in its `url` and in the answer a client
gets while the service is not listening yet. A `tcp` tunnel relays bytes
unread, but for a first request head when its client starts with one: a
browser's, judged for its Host and Origin as an `http` tunnel's (page_refusal).

A rental with a stack whose template has isSSHEnabled gets one more
listener, its SSH endpoint, one for all its stacks: each connection is an
`ssh` stream naming those stacks (ssh_stacks), which the agent's own SSH
server terminates (the login name `<service>.<stack id prefix>` picks the
stack and the container), so only ciphertext passes here and one
host:port, one ssh config entry, serves every stack of the rental. Tunnel
info lists it once per container, with the login name and the agent's host
key (ssh_endpoint.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.local_marketplace import ssh_endpoint
from gpuhost_agent.local_marketplace.channel_hub import ChannelHub, StreamRefused
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.local_marketplace.tunnels import auth as tunnel_auth
from gpuhost_agent.local_marketplace.tunnels import relay as tunnel_relay
from gpuhost_agent.local_marketplace.tunnels import requests as tunnel_requests
from gpuhost_agent.local_marketplace.tunnels.probes import TunnelProbes
from gpuhost_agent.protocol import wire, wire_time

log = get_logger(__name__)

# Jupyter, TensorBoard, Gradio, ComfyUI, Streamlit, Vite, dev servers and plain web.
HTTP_PORTS = frozenset({80, 3000, 5000, 5173, 6006, 7860, 8000, 8080, 8081, 8188, 8501, 8888})
SERVICE_LABEL = "com.docker.compose.service"
SYNC_PERIOD = 0.5  # seconds between looks at the container lists
SSH = ssh_endpoint.SSH
SSH_KEY_STACK, SSH_KEY_CONTAINER, SSH_KEY_PORT = "", "", 0  # a rental's SSH endpoint is keyed on the rental alone
SSH_ENDPOINT_PREFIX = "rental/"  # the store's key for a rental's SSH endpoint: rental/<rental id>/ssh
NEW_PORT_TRIES = 32  # system-picked ports tried before one kept for another tunnel is taken anyway


@dataclass(frozen=True)
class TunnelKey:
    rental_id: str
    stack_id: str
    container_id: str
    port: int


@dataclass(eq=False)
class Tunnel:
    key: TunnelKey
    service: str
    protocol: str
    server: asyncio.base_events.Server | None = None
    listen_port: int = 0
    status: str = "starting"
    error: str | None = None
    connections: set[asyncio.Task] = field(default_factory=set)
    gate: tunnel_auth.Gate | None = None  # basic auth, for an http tunnel of a stack that asks for it
    auth: dict | None = None  # what the renter's tunnel info shows of it, but the link (minted per read)
    name: str = ""  # the container's name: with the port, what its address is kept under (endpoint_key)
    notice: str | None = None  # why the tunnel is not on the port it had before

    @property
    def endpoint_key(self) -> str:
        """What the store keeps the listening port under: stable across
        restarts of the agent and of the marketplace (a container's name is,
        its id is not once it is recreated)."""
        key = self.key
        if self.protocol == SSH:
            return f"{SSH_ENDPOINT_PREFIX}{key.rental_id}/ssh"
        return f"{key.stack_id}/{self.name or key.container_id}/{key.port}"

    @property
    def tunnel_id(self) -> str:
        key = self.key
        return hashlib.sha256(f"{key.stack_id}/{key.container_id}/{key.port}".encode()).hexdigest()[:16]

    @property
    def browser_host(self) -> str:
        """The name a browser reaches it by: a basic-auth tunnel's own
        (tunnel_auth.host_name, where its session cookie stays), else 127.0.0.1."""
        return tunnel_auth.host_name(self.tunnel_id) if self.gate is not None else "127.0.0.1"

    def as_wire(self) -> dict:
        http = self.protocol == "http"
        return {
            "tunnelId": self.tunnel_id,
            "service": self.service,
            "containerId": self.key.container_id,
            "containerPort": self.key.port,
            "protocol": self.protocol,
            "url": f"http://{self.browser_host}:{self.listen_port}/" if http else None,
            "host": "127.0.0.1",
            "port": self.listen_port,
            "auth": self._auth(),
            "status": self.status,
            "error": self.error,
            "notice": self.notice,
        }

    def _auth(self) -> dict | None:
        """The credentials, with a new one-time sign-in link (tunnel_auth.py)."""
        if self.auth is None or self.gate is None:
            return self.auth
        token, _expires = self.gate.new_link()
        expires_at = wire_time.iso(wire_time.utcnow() + timedelta(seconds=tunnel_auth.LINK_SECONDS))
        link = f"http://{self.browser_host}:{self.listen_port}/?{tunnel_auth.TOKEN_PARAM}={token}"
        return {**self.auth, "link": link, "linkExpiresAt": expires_at}


def _service(container: dict) -> str:
    labels = dict(str(label).partition("=")[::2] for label in container.get("Labels") or [])
    return labels.get(SERVICE_LABEL) or container.get("Name", "")


def _running(store: Store, stack_id: str) -> list[dict]:
    return [
        c
        for c in (store.containers.get(stack_id) or {}).get("containers") or []
        if str(c.get("State")).startswith("running") and c.get("Id")  # "running (unhealthy)" serves too
    ]


def _serving(store: Store, stack: dict) -> bool:
    """Whether the stack's tunnels are open: APPLIED, its rental active."""
    rental = store.rentals.get(stack["rentalId"]) or {}
    return stack.get("status") == wire.APPLIED and rental.get("status") == wire.RENTAL_ACTIVE


def _ssh_enabled(stack: dict) -> bool:
    return (stack.get("template") or {}).get("isSSHEnabled") is True


def ssh_stacks(store: Store, rental_id: str) -> list[str]:
    """The rental's stacks a login to its SSH endpoint may pick now: open,
    SSH-enabled, a container running. The ssh request lists them; the agent
    checks each against Docker's labels whatever this says."""
    return [
        stack_id
        for stack_id, stack in store.stacks.items()
        if stack["rentalId"] == rental_id
        and _serving(store, stack)
        and _ssh_enabled(stack)
        and _running(store, stack_id)
    ]


def ssh_key(rental_id: str) -> TunnelKey:
    return TunnelKey(rental_id, SSH_KEY_STACK, SSH_KEY_CONTAINER, SSH_KEY_PORT)


def wanted(store: Store) -> dict[TunnelKey, tuple[str, str, str]]:
    """(service, protocol, container name) of every tunnel there should be now."""
    tunnels: dict[TunnelKey, tuple[str, str, str]] = {}
    for stack_id, stack in store.stacks.items():
        if not _serving(store, stack):
            continue
        running = _running(store, stack_id)
        if running and _ssh_enabled(stack):
            tunnels[ssh_key(stack["rentalId"])] = ("", SSH, "")
        for container in running:
            service = _service(container)
            for port in {p["PrivatePort"] for p in container.get("Ports") or [] if p.get("Type", "tcp") == "tcp"}:
                key = TunnelKey(stack["rentalId"], stack_id, container["Id"], int(port))
                name = str(container.get("Name") or "").lstrip("/")
                http = port in HTTP_PORTS or bool(stack.get("basicAuth"))  # basic auth gates every port
                tunnels[key] = (service, "http" if http else "tcp", name)
    return tunnels


class TunnelBook:
    def __init__(self, store: Store, hub: ChannelHub, host: str = "127.0.0.1"):
        self.store, self.hub, self.host = store, hub, host
        self.tunnels: dict[TunnelKey, Tunnel] = {}
        self.probes = TunnelProbes(hub, lambda: self.tunnels.values(), self._fields)  # of the `starting` tunnels

    def for_stack(self, stack_id: str) -> list[dict]:
        return [entry for _, entry in sorted(self._entries(stack_id), key=lambda pair: pair[0])]

    def for_container(self, stack_id: str, container_id: str) -> list[dict]:
        return [
            entry
            for _, entry in sorted(self._entries(stack_id), key=lambda pair: pair[0])
            if entry["containerId"] == container_id
        ]

    def _entries(self, stack_id: str) -> list[tuple[tuple[str, int], dict]]:
        """(order, tunnel info) of the stack's tunnels; its rental's SSH
        endpoint once per running container, when the stack is SSH-enabled."""
        entries = [
            ((key.container_id, key.port), tunnel.as_wire())
            for key, tunnel in self.tunnels.items()
            if key.stack_id == stack_id and tunnel.protocol != SSH
        ]
        stack = self.store.stacks.get(stack_id)
        ssh = self.tunnels.get(ssh_key(stack["rentalId"])) if stack and _ssh_enabled(stack) else None
        if ssh is not None and _serving(self.store, stack or {}):
            host_key = self.store.host.get("sshHostKey")
            for container in _running(self.store, stack_id):
                status = ssh.status if ssh.status == "error" else ("ready" if host_key else "starting")
                entry = ssh_endpoint.ssh_entry(
                    stack_id, container["Id"], _service(container), ssh.listen_port, host_key, self.store.envId
                )
                entry.update(status=status, error=ssh.error, notice=ssh.notice)
                entries.append(((container["Id"], -1), entry))
        return entries

    async def run(self, period: float = SYNC_PERIOD) -> None:
        try:
            while True:
                await self.sync()
                await asyncio.sleep(period)
        finally:
            await self.close_all()

    async def sync(self) -> None:
        want = wanted(self.store)
        for key in [key for key in self.tunnels if key not in want]:
            await self._close(self.tunnels.pop(key))
        self.probes.forget({key.stack_id for key in want})
        for key, (service, protocol, name) in want.items():
            if key in self.tunnels:
                if self._arm(self.tunnels[key]):  # a new password since (POST .../tunnel-password)
                    await self._end_connections(self.tunnels[key])
            else:
                tunnel = Tunnel(key, service, protocol, name=name)
                await self._listen(tunnel)
                self._arm(tunnel)
                self.tunnels[key] = tunnel
        self._forget_endpoints()
        self.probes.start()

    async def _listen(self, tunnel: Tunnel) -> None:
        """A listener on the port the tunnel had before (the store keeps it),
        so bookmarks, ssh configs and known_hosts pins survive restarts; on
        another port, said in the log and the tunnel info, when that one is
        taken."""
        serve = partial(self._serve, tunnel)
        kept = int(self.store.endpoints.get(tunnel.endpoint_key, 0))
        server = None
        if kept:
            try:
                server = await asyncio.start_server(serve, self.host, kept, limit=tunnel_relay.CHUNK)
            except OSError as exc:
                log.warning("tunnel_port_taken", stack_id=tunnel.key.stack_id, port=kept, error=str(exc)[:200])
        if server is None:
            others = {int(port) for key, port in self.store.endpoints.items() if key != tunnel.endpoint_key}
            server = await self._new_port(serve, others)
        tunnel.server = server
        tunnel.listen_port = server.sockets[0].getsockname()[1]
        if kept and tunnel.listen_port != kept:
            tunnel.notice = (
                f"port {kept}, this tunnel's before, was taken when it reopened: it moved to {tunnel.listen_port}"
            )
        if tunnel.listen_port != kept:
            self.store.endpoints[tunnel.endpoint_key] = tunnel.listen_port
            self.store.save()
        log.info(
            "tunnel_opened",
            tunnel_id=tunnel.tunnel_id,
            stack_id=tunnel.key.stack_id,
            container_port=tunnel.key.port,
            protocol=tunnel.protocol,
            listen_port=tunnel.listen_port,
            kept=tunnel.listen_port == kept,
        )

    async def _new_port(self, serve: Callable, others: set[int]) -> asyncio.base_events.Server:
        """A listener on a port the system picks, but none kept for another
        tunnel: that tunnel may be closed for a moment (its stack redeploying)
        and reopens on its own port. A port refused stays bound until the
        choice is made, so the system picks another each time."""
        refused: list[asyncio.base_events.Server] = []
        try:
            for _ in range(NEW_PORT_TRIES):
                server = await asyncio.start_server(serve, self.host, 0, limit=tunnel_relay.CHUNK)
                if server.sockets[0].getsockname()[1] not in others:
                    return server
                refused.append(server)
            return refused.pop()  # every try kept for another (never seen): the last one, rather than none
        finally:
            for server in refused:
                server.close()

    def _forget_endpoints(self) -> None:
        """The kept ports of stacks the store no longer has, and the SSH
        endpoints of rentals that ended (an active rental's is kept while it
        has no SSH stack: a stack removed and made again finds it)."""
        active = {r for r, rental in self.store.rentals.items() if rental.get("status") == wire.RENTAL_ACTIVE}

        def kept(key: str) -> bool:
            if key.startswith(SSH_ENDPOINT_PREFIX):
                return key[len(SSH_ENDPOINT_PREFIX) :].partition("/")[0] in active
            return key.partition("/")[0] in self.store.stacks

        gone = [key for key in self.store.endpoints if not kept(key)]
        for key in gone:
            del self.store.endpoints[key]
        if gone:
            self.store.save()

    def _rental_ports(self, rental_id: str) -> frozenset[int]:
        """The listening ports of the rental's tunnels: the origins its pages may come from."""
        return frozenset(t.listen_port for t in self.tunnels.values() if t.key.rental_id == rental_id and t.listen_port)

    def _insecure(self, stack_id: str) -> bool:
        return ((self.store.stacks.get(stack_id) or {}).get("template") or {}).get("insecure") is True

    def _arm(self, tunnel: Tunnel) -> bool:
        """Basic auth for an http tunnel of a stack created with isBasicAuthEnabled.
        A new gate for a new password: the old one's sessions and links end
        with it. Whether a gate was replaced (its connections must end too)."""
        credentials = (self.store.stacks.get(tunnel.key.stack_id) or {}).get("basicAuth")
        if tunnel.protocol != "http" or not credentials:
            return False
        if tunnel.gate is not None and tunnel.gate.password_hash == credentials["passwordHash"]:
            return False
        replaced = tunnel.gate is not None
        tunnel.gate = tunnel_auth.Gate(credentials["passwordHash"], tunnel.tunnel_id)
        generation = int(credentials.get("generation", 0))
        tunnel.auth = {
            "type": "basic",
            "username": credentials["username"],
            "password": tunnel_auth.password(self.store.tunnelSecret, tunnel.key.stack_id, generation),
        }
        return replaced

    def _fields(self, tunnel: Tunnel) -> dict[str, object]:
        """The stream request for one connection of the tunnel."""
        key = tunnel.key
        if tunnel.protocol == SSH:
            return {"stackIds": ssh_stacks(self.store, key.rental_id)}
        fields: dict[str, object] = {"stackId": key.stack_id, "containerId": key.container_id, "port": key.port}
        if tunnel.protocol == "http" and self._insecure(key.stack_id):
            fields["tls"] = True  # HTTPS to a self-signed service
        return fields

    async def close_all(self) -> None:
        await self.probes.stop()
        tunnels, self.tunnels = list(self.tunnels.values()), {}
        for tunnel in tunnels:
            await self._close(tunnel)

    async def _close(self, tunnel: Tunnel) -> None:
        if tunnel.server is not None:
            tunnel.server.close()
        await self._end_connections(tunnel)
        where = {"stack_id": tunnel.key.stack_id} if tunnel.key.stack_id else {"endpoint": "ssh"}  # the rental's SSH
        log.info("tunnel_closed", tunnel_id=tunnel.tunnel_id, rental_id=tunnel.key.rental_id, **where)

    async def _end_connections(self, tunnel: Tunnel) -> None:
        """Every open connection of the tunnel, ended: when it closes, and when
        its password changes, since a connection the old gate let through (an
        upgraded WebSocket, a long download) is not checked again."""
        connections = list(tunnel.connections)
        for task in connections:
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
        if connections and tunnel.server is not None and tunnel.server.is_serving():
            log.info("tunnel_connections_ended", tunnel_id=tunnel.tunnel_id, connections=len(connections))

    async def _serve(self, tunnel: Tunnel, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client: a stream from the agent, relayed until either side ends.
        Counted on the tunnel, so closing the tunnel ends its connections."""
        key = tunnel.key
        task = asyncio.current_task()
        if task is not None:
            tunnel.connections.add(task)
            task.add_done_callback(tunnel.connections.discard)
        try:
            first = b""  # an http tunnel's first request head, ours stripped (and let through by its gate)
            framing: tunnel_requests.Framing | None = None  # how its body ends, for its next requests
            client = "?"
            rental_ports = self._rental_ports(key.rental_id)  # the pages that may send requests (origin_problem)
            if tunnel.protocol == "http":
                head = tunnel_auth.parse_head(await tunnel_relay.read_head(reader) or b"")
                if head is None:
                    await tunnel_relay.write_answer(writer, 400, [], "not an HTTP request")
                    return
                try:
                    framing = tunnel_requests.framing(head)
                except tunnel_requests.Unframed as exc:
                    await tunnel_relay.write_answer(writer, 400, [], f"not a request this tunnel passes on: {exc}")
                    return
                peer = writer.get_extra_info("peername")
                client = str(peer[0]) if peer else "?"
                decision = await tunnel_requests.judged(
                    tunnel.gate, head, client, tunnel.listen_port, rental_ports, tunnel.tunnel_id
                )
                if decision.forward is None:
                    await tunnel_relay.write_answer(
                        writer, decision.status, decision.headers, decision.text, go_to=decision.go_to
                    )
                    return
                first = decision.forward.render()
            elif tunnel.protocol == "tcp":
                # Bytes relayed unread, but for a browser's request to an HTTP service on any port (Ollama on
                # 11434): its first head meets the Host and Origin checks; its next come from the same origin,
                # as a browser keeps a connection to one.
                first = await tunnel_requests.sniffed(reader)
                if tunnel_requests.starts_a_request(first):
                    rest = await tunnel_relay.read_head(reader)
                    head = tunnel_auth.parse_head(first + rest) if rest is not None else None
                    if head is None:
                        await tunnel_relay.write_answer(writer, 400, [], "not an HTTP request")
                        return
                    if refusal := tunnel_requests.page_refusal(head, tunnel.listen_port, rental_ports):
                        await tunnel_relay.write_answer(writer, refusal.status, refusal.headers, refusal.text)
                        return
                    first += rest or b""
            kind = SSH if tunnel.protocol == SSH else "tunnel"
            fields = self._fields(tunnel)
            if fields.get("stackIds") == []:  # its last SSH stack went since the last sync: closing
                return
            try:
                stream = await self.hub.open(kind, key.rental_id, fields)
            except StreamRefused as refused:
                log.info("tunnel_refused", tunnel_id=tunnel.tunnel_id, status=refused.status, error=refused.message)
                starting = tunnel_relay.is_not_listening(refused.status, refused.message)
                tunnel.status, tunnel.error = ("starting", None) if starting else ("error", refused.message)
                if tunnel.protocol == "http":
                    await tunnel_relay.answer_unavailable(
                        reader, writer, refused.status, refused.message, starting=starting, head_read=bool(first)
                    )
                return
            tunnel.status, tunnel.error = "ready", None
            try:
                assert stream.agent_ws is not None  # set when the agent's stream socket opened
                if first:
                    await stream.agent_ws.send_bytes(first)
                forward = (
                    None
                    if framing is None
                    else tunnel_requests.next_requests(
                        lambda: tunnel.gate,
                        reader,
                        stream.agent_ws.send_bytes,
                        framing,
                        client,
                        tunnel.listen_port,
                        rental_ports,
                        tunnel.tunnel_id,
                    )
                )
                relay = asyncio.ensure_future(tunnel_relay.relay(reader, writer, stream.agent_ws, forward=forward))
                ended = asyncio.ensure_future(stream.ended.wait())
                try:
                    await asyncio.wait({relay, ended}, return_when=asyncio.FIRST_COMPLETED)
                finally:  # ended here too (the connection cancelled): no byte relayed after it
                    for task in (relay, ended):
                        task.cancel()
                    await asyncio.gather(relay, ended, return_exceptions=True)
            finally:
                await self.hub.finish(stream)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

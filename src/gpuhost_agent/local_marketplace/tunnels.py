"""The tunnels of the rentals' stacks: one loopback listener per TCP port a
running container declares, while its stack is APPLIED and its rental active.

Each connection to a listener becomes a `tunnel` stream through the agent's
channel (tunnel_relay.py), so the service is reached over connections the
agent opened, with nothing opened on the host. The book follows the container
lists the agent reports: a port that appears gets a listener, one that goes
(container removed, stack removed, rental ended) loses it. A container that
restarts keeps its tunnel: the agent looks its address up for each connection.

Which tunnels are `http`: the ports web services use by convention (below).
An `http` tunnel is the same byte relay; it differs only in its `url` and in
the answer a client gets while the service is not listening yet.

A stack whose template has isSSHEnabled gets one more listener, its SSH
endpoint: each connection is an `ssh` stream, which the agent's own SSH
server terminates (the login name picks the container), so only ciphertext
passes here. Tunnel info lists it once per container, with the login name
and the agent's host key (ssh_entry).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass, field
from functools import partial

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.local_marketplace import tunnel_auth, tunnel_relay
from gpuhost_agent.local_marketplace.channel_hub import ChannelHub, StreamRefused
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import ssh_login, wire

log = get_logger(__name__)

# Jupyter, TensorBoard, Gradio, ComfyUI, Streamlit, Vite, dev servers and plain web.
HTTP_PORTS = frozenset({80, 3000, 5000, 5173, 6006, 7860, 8000, 8080, 8081, 8188, 8501, 8888})
SERVICE_LABEL = "com.docker.compose.service"
SYNC_PERIOD = 0.5  # seconds between looks at the container lists
SSH = "ssh"
SSH_KEY_CONTAINER, SSH_KEY_PORT = "", 0  # a stack's SSH endpoint is keyed on the stack alone


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
    auth: dict | None = None  # what the renter's tunnel info shows of it

    @property
    def tunnel_id(self) -> str:
        key = self.key
        return hashlib.sha256(f"{key.stack_id}/{key.container_id}/{key.port}".encode()).hexdigest()[:16]

    def as_wire(self) -> dict:
        http = self.protocol == "http"
        return {
            "tunnelId": self.tunnel_id,
            "service": self.service,
            "containerId": self.key.container_id,
            "containerPort": self.key.port,
            "protocol": self.protocol,
            "url": f"http://127.0.0.1:{self.listen_port}/" if http else None,
            "host": "127.0.0.1",
            "port": self.listen_port,
            "auth": self.auth,
            "status": self.status,
            "error": self.error,
        }


def ssh_entry(tunnel: Tunnel, container: dict, host_key: dict | None) -> dict:
    """The SSH endpoint as one container's tunnel info shows it."""
    service = _service(container)
    user = ssh_login.ssh_login_name(service, tunnel.key.stack_id)
    port = tunnel.listen_port
    return {
        "tunnelId": hashlib.sha256(f"{tunnel.key.stack_id}/{container['Id']}/ssh".encode()).hexdigest()[:16],
        "service": service,
        "containerId": container["Id"],
        "containerPort": None,
        "protocol": SSH,
        "url": None,
        "host": "127.0.0.1",
        "port": port,
        "auth": None,
        "status": tunnel.status,
        "error": tunnel.error,
        "ssh": {
            "host": "127.0.0.1",
            "port": port,
            "user": user,
            "hostKeyFingerprint": (host_key or {}).get("hostKeyFingerprint"),
            "hostKey": (host_key or {}).get("hostKey"),
            "command": f"ssh -p {port} {user}@127.0.0.1",
        },
    }


def _service(container: dict) -> str:
    labels = dict(str(label).partition("=")[::2] for label in container.get("Labels") or [])
    return labels.get(SERVICE_LABEL) or container.get("Name", "")


def _running(store: Store, stack_id: str) -> list[dict]:
    return [
        c
        for c in (store.containers.get(stack_id) or {}).get("containers") or []
        if str(c.get("State")).startswith("running") and c.get("Id")  # "running (unhealthy)" serves too
    ]


def wanted(store: Store) -> dict[TunnelKey, tuple[str, str]]:
    """(service, protocol) of every tunnel there should be now."""
    tunnels: dict[TunnelKey, tuple[str, str]] = {}
    for stack_id, stack in store.stacks.items():
        rental = store.rentals.get(stack["rentalId"]) or {}
        if stack.get("status") != wire.APPLIED or rental.get("status") != "ACTIVE":
            continue
        running = _running(store, stack_id)
        if running and (stack.get("template") or {}).get("isSSHEnabled") is True:
            tunnels[TunnelKey(stack["rentalId"], stack_id, SSH_KEY_CONTAINER, SSH_KEY_PORT)] = ("", SSH)
        for container in running:
            service = _service(container)
            for port in {p["PrivatePort"] for p in container.get("Ports") or [] if p.get("Type", "tcp") == "tcp"}:
                key = TunnelKey(stack["rentalId"], stack_id, container["Id"], int(port))
                tunnels[key] = (service, "http" if port in HTTP_PORTS else "tcp")
    return tunnels


class TunnelBook:
    def __init__(self, store: Store, hub: ChannelHub, host: str = "127.0.0.1"):
        self.store, self.hub, self.host = store, hub, host
        self.tunnels: dict[TunnelKey, Tunnel] = {}

    def for_stack(self, stack_id: str) -> list[dict]:
        return [entry for _, entry in sorted(self._entries(stack_id), key=lambda pair: pair[0])]

    def for_container(self, stack_id: str, container_id: str) -> list[dict]:
        return [
            entry
            for _, entry in sorted(self._entries(stack_id), key=lambda pair: pair[0])
            if entry["containerId"] == container_id
        ]

    def _entries(self, stack_id: str) -> list[tuple[tuple[str, int], dict]]:
        """(order, tunnel info) of the stack's tunnels; its SSH endpoint once per running container."""
        entries = []
        for key, tunnel in self.tunnels.items():
            if key.stack_id != stack_id:
                continue
            if tunnel.protocol != SSH:
                entries.append(((key.container_id, key.port), tunnel.as_wire()))
                continue
            host_key = self.store.host.get("sshHostKey")
            for container in _running(self.store, stack_id):
                entries.append(((container["Id"], -1), ssh_entry(tunnel, container, host_key)))
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
        for key, (service, protocol) in want.items():
            if key not in self.tunnels:
                tunnel = Tunnel(key, service, protocol)
                tunnel.server = await asyncio.start_server(
                    partial(self._serve, tunnel), self.host, 0, limit=tunnel_relay.CHUNK
                )
                tunnel.listen_port = tunnel.server.sockets[0].getsockname()[1]
                self._arm(tunnel)
                self.tunnels[key] = tunnel
                log.info(
                    "tunnel_opened",
                    tunnel_id=tunnel.tunnel_id,
                    stack_id=key.stack_id,
                    container_port=key.port,
                    protocol=protocol,
                    listen_port=tunnel.listen_port,
                )

    def _insecure(self, stack_id: str) -> bool:
        return ((self.store.stacks.get(stack_id) or {}).get("template") or {}).get("insecure") is True

    def _arm(self, tunnel: Tunnel) -> None:
        """Basic auth for an http tunnel of a stack created with isBasicAuthEnabled."""
        credentials = (self.store.stacks.get(tunnel.key.stack_id) or {}).get("basicAuth")
        if tunnel.protocol != "http" or not credentials:
            return
        secret = self.store.tunnelSecret
        link = tunnel_auth.link_token(secret, tunnel.tunnel_id)
        tunnel.gate = tunnel_auth.Gate(credentials["passwordHash"], link, f"tunnel {tunnel.tunnel_id}")
        tunnel.auth = {
            "type": "basic",
            "username": credentials["username"],
            "password": tunnel_auth.password(secret, tunnel.key.stack_id),
            "link": f"http://127.0.0.1:{tunnel.listen_port}/?{tunnel_auth.TOKEN_PARAM}={link}",
        }

    async def close_all(self) -> None:
        tunnels, self.tunnels = list(self.tunnels.values()), {}
        for tunnel in tunnels:
            await self._close(tunnel)

    async def _close(self, tunnel: Tunnel) -> None:
        if tunnel.server is not None:
            tunnel.server.close()
        for task in tunnel.connections:
            task.cancel()
        await asyncio.gather(*tunnel.connections, return_exceptions=True)
        log.info("tunnel_closed", tunnel_id=tunnel.tunnel_id, stack_id=tunnel.key.stack_id)

    async def _serve(self, tunnel: Tunnel, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client: a stream from the agent, relayed until either side ends.
        Counted on the tunnel, so closing the tunnel ends its connections."""
        key = tunnel.key
        task = asyncio.current_task()
        if task is not None:
            tunnel.connections.add(task)
            task.add_done_callback(tunnel.connections.discard)
        try:
            first = b""  # the first request's head, once the gate let it through
            if tunnel.gate is not None:
                head = tunnel_auth.parse_head(await tunnel_relay.read_head(reader) or b"")
                if head is None:
                    await tunnel_relay.write_answer(writer, 400, [], "not an HTTP request")
                    return
                peer = writer.get_extra_info("peername")
                decision = await tunnel.gate.decide(head, str(peer[0]) if peer else "?")
                if decision.forward is None:
                    await tunnel_relay.write_answer(writer, decision.status, decision.headers, decision.text)
                    return
                first = decision.forward.render()
            fields: dict[str, str | int]
            if tunnel.protocol == SSH:
                kind, fields = SSH, {"stackId": key.stack_id}
            else:
                kind, fields = "tunnel", {"stackId": key.stack_id, "containerId": key.container_id, "port": key.port}
                if tunnel.protocol == "http" and self._insecure(key.stack_id):
                    fields["tls"] = True  # HTTPS to a self-signed service
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
                relay = asyncio.ensure_future(tunnel_relay.relay(reader, writer, stream.agent_ws))
                ended = asyncio.ensure_future(stream.ended.wait())
                await asyncio.wait({relay, ended}, return_when=asyncio.FIRST_COMPLETED)
                for task in (relay, ended):
                    task.cancel()
                await asyncio.gather(relay, ended, return_exceptions=True)
            finally:
                await self.hub.finish(stream)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

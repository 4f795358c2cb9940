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
from gpuhost_agent.protocol import wire

log = get_logger(__name__)

# Jupyter, TensorBoard, Gradio, ComfyUI, Streamlit, Vite, dev servers and plain web.
HTTP_PORTS = frozenset({80, 3000, 5000, 5173, 6006, 7860, 8000, 8080, 8081, 8188, 8501, 8888})
SERVICE_LABEL = "com.docker.compose.service"
SYNC_PERIOD = 0.5  # seconds between looks at the container lists


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


def wanted(store: Store) -> dict[TunnelKey, tuple[str, str]]:
    """(service, protocol) of every tunnel there should be now."""
    tunnels: dict[TunnelKey, tuple[str, str]] = {}
    for stack_id, stack in store.stacks.items():
        rental = store.rentals.get(stack["rentalId"]) or {}
        if stack.get("status") != wire.APPLIED or rental.get("status") != "ACTIVE":
            continue
        for container in (store.containers.get(stack_id) or {}).get("containers") or []:
            if container.get("State") != "running" or not container.get("Id"):
                continue
            labels = dict(str(label).partition("=")[::2] for label in container.get("Labels") or [])
            service = labels.get(SERVICE_LABEL) or container.get("Name", "")
            for port in {p["PrivatePort"] for p in container.get("Ports") or [] if p.get("Type", "tcp") == "tcp"}:
                key = TunnelKey(stack["rentalId"], stack_id, container["Id"], int(port))
                tunnels[key] = (service, "http" if port in HTTP_PORTS else "tcp")
    return tunnels


class TunnelBook:
    def __init__(self, store: Store, hub: ChannelHub, host: str = "127.0.0.1"):
        self.store, self.hub, self.host = store, hub, host
        self.tunnels: dict[TunnelKey, Tunnel] = {}

    def for_stack(self, stack_id: str) -> list[dict]:
        return [t.as_wire() for k, t in sorted(self.tunnels.items(), key=_order) if k.stack_id == stack_id]

    def for_container(self, stack_id: str, container_id: str) -> list[dict]:
        return [
            t.as_wire()
            for t in self.tunnels.values()
            if t.key.stack_id == stack_id and t.key.container_id == container_id
        ]

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
                decision = tunnel.gate.decide(head, str(peer[0]) if peer else "?")
                if decision.forward is None:
                    await tunnel_relay.write_answer(writer, decision.status, decision.headers, decision.text)
                    return
                first = decision.forward.render()
            try:
                stream = await self.hub.open(
                    "tunnel",
                    key.rental_id,
                    {"stackId": key.stack_id, "containerId": key.container_id, "port": key.port},
                )
            except StreamRefused as refused:
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


def _order(item: tuple[TunnelKey, Tunnel]) -> tuple[str, int]:
    return item[0].container_id, item[0].port

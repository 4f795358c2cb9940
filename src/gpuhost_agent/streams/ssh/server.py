"""SSH into a rental's containers, terminated in the agent (docs/streams.md, "ssh").

An `ssh` stream carries one renter's TCP connection to the rental's SSH
endpoint, byte for byte: the marketplace relays ciphertext and never holds a
key that could read it. The agent runs asyncssh on one end of a socket pair
and relays the other end to the stream (streams/tunnel.TunnelRelay), so the
SSH connection gets the same backpressure and half-close as any tunnel.

What a connection may do: log in with a key the marketplace lists for the
rental, to the container the login name picks (streams/ssh/access.py); run
sessions there (streams/ssh/session.py); move files with SFTP or SCP
(streams/ssh/files.py); `ssh -L` (and `-D`, whose SOCKS connections are the
same direct-tcpip channels) to `localhost`, 127.0.0.1 or ::1 on any port,
which is the login's container's own loopback, dialled inside its network
namespace (Jupyter, TensorBoard, VS Code Remote-SSH's server listen there),
or to a TCP port that another container of the same stack declares, on that
container's own addresses (the tunnel rule). Nothing else: not the host, not
another stack. No password or keyboard-interactive login, no agent or X11
forwarding, no remote forwarding, no Unix socket forwarding.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import asyncssh
from asyncssh.stream import SSHTCPStreamSession

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.records import ContainerSummary
from gpuhost_agent.streams.admission import check_access, connect_own_loopback, connect_tunnel
from gpuhost_agent.streams.requests import Refusal, SshRequest, TunnelRequest
from gpuhost_agent.streams.ssh.access import SERVICE_LABEL, SshServices, parse_login, pick_container
from gpuhost_agent.streams.ssh.channels import FORWARD, SESSION, ChannelRefused, Slot
from gpuhost_agent.streams.tunnel import own_loopback
from gpuhost_agent.uplink.replies import MarketplaceRejected, MarketplaceUnavailable

log = get_logger(__name__)

MAX_AUTH_TRIES = 6  # refused keys on one connection before it is closed (OpenSSH's MaxAuthTries)


class Login(asyncssh.SSHServer):
    """asyncssh's per-connection callbacks: who logs in, where -L may go."""

    def __init__(
        self,
        services: SshServices,
        request: SshRequest,
        env_id: str | None,
        sessions: Callable[[Slot], asyncssh.SSHServerSession],
    ):
        self._services, self._request, self._env_id = services, request, env_id
        self._sessions = sessions  # a session channel's handler, given its slot
        self.container: ContainerSummary | None = None  # the `docker ps` entry the login picked, once looked up
        self.stack_id = ""  # the stack of the rental the login name picked
        self._service = ""  # the service it picked
        self._looked_up: asyncio.Future[str | None] | None = None  # after the signature: why none, or None
        self.channels = services.channels.connection(request.rental_id)
        self._conn: asyncssh.SSHServerConnection | None = None
        self._refused = 0  # refused login attempts on this connection

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn

    def auth_completed(self) -> None:
        """Logged in: the connection leaves the rental's few pre-login places
        for its connection cap (streams/admission.py), and counts under the
        stack its login name picked; its container is looked up now, after
        the signature (looked_up)."""
        self._request.login.stack_id = self.stack_id
        self._request.login.logged_in = True
        self._looked_up = asyncio.ensure_future(self._look_up())

    async def looked_up(self) -> str | None:
        """Once logged in: None when the login's container was found (`container`),
        else why there is none, for the client."""
        if self._looked_up is None:
            return "not logged in"
        return await asyncio.shield(self._looked_up)

    async def _look_up(self) -> str | None:
        try:
            containers = await self._services.stack_containers(self.stack_id)
        except EngineError as exc:
            return f"cannot find the container now: {exc}"[:300]
        request = self._request
        self.container = pick_container(containers, self._service, self._env_id, request.rental_id, self.stack_id)
        if self.container is None:
            log.info("ssh_login_without_container", stream_id=request.stream_id, service=self._service[:80])
            return f"no running container of service {self._service!r} open to SSH in this stack"
        return None

    def _take(self, kind: str) -> Slot:
        try:
            return self.channels.take(kind)
        except ChannelRefused as refused:
            log.info("ssh_channel_refused", stream_id=self._request.stream_id, kind=kind, reason=str(refused))
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, str(refused)) from None

    def session_requested(self) -> asyncssh.SSHServerSession:
        """A session channel (a shell, a command, SFTP or SCP), within the caps."""
        return self._sessions(self._take(SESSION))

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        """The key and the name alone, no Docker call: the rental's key list is
        cached (streams/ssh_access.RentalKeys), so neither the time of a
        refusal nor the engine's load tells a stranger which login names are
        live; and a key query without a signature (PK_OK) tells a holder of
        the renter's public key nothing of which services run either. The
        container is looked up once the signature passed (auth_completed).
        Past MAX_AUTH_TRIES refusals the connection is closed."""
        request = self._request
        picked = parse_login(username, request.stack_ids)
        if picked is None:
            return self._refuse(username, "the login name is not <service>.<stack id prefix> of this rental's stacks")
        try:
            if not await self._services.keys.allows(request.rental_id, key.export_public_key("openssh").decode()):
                return self._refuse(username, "the key is not one of the renter's SSH keys")
        except (MarketplaceUnavailable, MarketplaceRejected) as exc:
            return self._refuse(username, f"cannot check the login now: {exc}"[:300])
        self._service, self.stack_id = picked
        return True

    def _refuse(self, username: str, reason: str) -> bool:
        self._refused += 1
        log.info("ssh_login_refused", stream_id=self._request.stream_id, user=username[:80], reason=reason)
        if self._refused >= MAX_AUTH_TRIES and self._conn is not None:
            log.info("ssh_login_closed", stream_id=self._request.stream_id, reason="too many refused logins")
            self._conn.disconnect(asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE, "too many authentication failures")
        return False

    def connection_requested(  # asyncssh takes a coroutine here, and awaits it
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> Coroutine[Any, Any, SSHTCPStreamSession]:
        slot = self._take(FORWARD)  # counted from its opening: a refused or failed one gives it back
        return self._forward(dest_host, dest_port, slot)

    async def _forward(self, dest_host: str, dest_port: int, slot: Slot) -> SSHTCPStreamSession:
        try:
            return _CountedForward(slot, *await self._connect(dest_host, dest_port))
        except BaseException:
            slot.release()
            raise

    async def _connect(self, dest_host: str, dest_port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """`ssh -L`/`-D`: the login's container's own loopback, any port; or a
        container of this stack, by service name, container name or address,
        on a port it declares; anything else is refused."""
        loopback = own_loopback(dest_host)
        if loopback:
            return await self._own_loopback(dest_host, dest_port, loopback)
        request, stack_id = self._request, self.stack_id
        if not stack_id:  # a channel opens only after the login
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, "not logged in")
        try:
            containers = await self._services.stack_containers(stack_id)
            target = _named(containers, dest_host)
            container = await self._services.engine.locate(target["Id"]) if target else None
        except EngineError as exc:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, f"Docker Engine: {exc}"[:200]) from None
        info = container.info if container is not None else {}
        tunnel = TunnelRequest(request.stream_id, request.rental_id, stack_id, str(info.get("Id", "")), dest_port)
        labels = info.get("Config", {}).get("Labels")
        if container is None or check_access(labels, self._env_id, tunnel) is not None:  # the tunnel rule
            log.info("ssh_forward_refused", stream_id=request.stream_id, target=dest_host[:80], port=dest_port)
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, f"{dest_host[:80]} is not a container of this stack"
            )
        engine = self._services.engine
        service = await connect_tunnel(container, tunnel, dial=engine.dial, network=engine.network)
        if isinstance(service, Refusal):
            log.info("ssh_forward_refused", stream_id=request.stream_id, target=dest_host[:80], port=dest_port)
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, service.error)
        return service

    async def _own_loopback(
        self, dest_host: str, dest_port: int, addresses: tuple[str, ...]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        request, login = self._request, (self.container if await self.looked_up() is None else None)
        if login is None:  # a channel opens only after the login; never the host's loopback whatever happens
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, "not logged in")
        try:
            container = await self._services.engine.locate(login["Id"])
        except EngineError as exc:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, f"Docker Engine: {exc}"[:200]) from None
        tunnel = TunnelRequest(request.stream_id, request.rental_id, self.stack_id, container.id, dest_port)
        service = await connect_own_loopback(container, tunnel, self._env_id, addresses)
        if isinstance(service, Refusal):
            log.info("ssh_forward_refused", stream_id=request.stream_id, target=dest_host[:80], port=dest_port)
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, service.error)
        return service


def _named(containers: list[ContainerSummary], name: str) -> ContainerSummary | None:
    for container in containers:
        labels = container.get("Labels") or {}
        names = {n.lstrip("/") for n in container.get("Names") or []}
        networks = ((container.get("NetworkSettings") or {}).get("Networks") or {}).values()
        addresses = {n.get("IPAddress") for n in networks if isinstance(n, dict)}
        if name in names or name in addresses or name == labels.get(SERVICE_LABEL):
            return container
        if len(name) >= 12 and str(container.get("Id", "")).startswith(name):
            return container
    return None


class _CountedForward(SSHTCPStreamSession):
    """One `-L` connection: the SSH channel and the service's socket, copied
    both ways with drain (flow control on each side) and half-close; its
    slot is given back when the channel closes."""

    def __init__(self, slot: Slot, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        async def pipe(channel_reader: asyncssh.SSHReader, channel_writer: asyncssh.SSHWriter) -> None:
            try:
                await asyncio.gather(_copy(channel_reader, writer), _copy(reader, channel_writer))
            except (ConnectionError, OSError, asyncssh.Error):
                pass
            finally:
                writer.close()
                channel_writer.close()

        super().__init__(pipe)
        self._slot = slot

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            self._slot.release()


async def _copy(
    source: asyncio.StreamReader | asyncssh.SSHReader, sink: asyncio.StreamWriter | asyncssh.SSHWriter
) -> None:
    while data := await source.read(64 * 1024):
        sink.write(data)
        await sink.drain()
    if sink.can_write_eof():
        sink.write_eof()

"""One `ssh` stream: an SSH server on one end of a socket pair, the stream on the other.

streams/ssh/server.py decides who logs in and where `-L` goes; this runs the
connection: asyncssh's server on its end of the pair (handshake, login, then
until either side closes), TunnelRelay between the other end and the stream,
sessions as Docker execs and SFTP/SCP through the container's file helper.
The channel stops it like any stream (rental end, agent stop).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import asyncssh
from asyncssh.public_key import get_default_public_key_algs
from asyncssh.sftp import MIN_SFTP_VERSION

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.streams import ContainerAt, ContainerGone
from gpuhost_agent.streams.requests import SshRequest
from gpuhost_agent.streams.sink import Sink
from gpuhost_agent.streams.ssh.access import SshServices
from gpuhost_agent.streams.ssh.channels import Slot
from gpuhost_agent.streams.ssh.files import ContainerSFTP
from gpuhost_agent.streams.ssh.server import Login
from gpuhost_agent.streams.ssh.session import ExecSession
from gpuhost_agent.streams.tunnel import CHUNK, TunnelRelay

log = get_logger(__name__)

LOGIN_TIMEOUT = 10.0  # a connection holds one of its rental's few pre-login places until then
# The ciphers offered, AES first: OpenSSH's client asks for
# chacha20-poly1305 first, which asyncssh computes with a new cipher object
# per packet; with AES (the CPU's AES instructions through `cryptography`),
# scp out of a container is about a third faster (docs/performance.md). Every OpenSSH and PuTTY client speaks these.
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr")
# The signature algorithms the server accepts for a login and names in server-sig-algs:
# asyncssh's defaults without DSA (ssh-dss, and its certificates), which OpenSSH
# removed and cryptography deprecates. Left unset, asyncssh's server advertises
# every algorithm it knows, DSA included.
SIGNATURE_ALGS = tuple(alg.decode() for alg in get_default_public_key_algs() if not alg.startswith(b"ssh-dss"))
KEEPALIVE_SECONDS = 30.0


class SshConnection:
    def __init__(self, services: SshServices, request: SshRequest, sink: Sink, env_id: str | None):
        self._services = services
        self._request = request
        self._sink = sink
        self._login = Login(services, request, env_id, self._counted_session)
        self._relay: TunnelRelay | None = None
        self._conn: asyncssh.SSHServerConnection | None = None
        self._stopped: str | None = None

    def stop(self, reason: str) -> None:
        self._stopped = self._stopped or reason
        if self._relay is not None:
            self._relay.stop(reason)
        if self._conn is not None:
            self._conn.close()

    async def run(self) -> str:
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours, limit=CHUNK)
        self._relay = TunnelRelay(self._sink, reader, writer)
        if self._stopped:
            self._relay.stop(self._stopped)
        relay = asyncio.create_task(self._relay.run())
        server = asyncio.create_task(self._serve(theirs))
        try:
            return await relay
        finally:
            if self._conn is not None:
                self._conn.close()
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
            self._login.channels.close()  # whatever a channel did not give back, the rental gets back

    def _counted_session(self, slot: Slot) -> asyncssh.SSHServerSession:
        return _CountedProcess(slot, self._session, self._sftp, MIN_SFTP_VERSION, True)

    async def _serve(self, sock: socket.socket) -> None:
        request = self._request
        try:
            conn = await asyncssh.run_server(
                sock,
                server_factory=lambda: self._login,
                server_host_keys=[self._services.host_key.key],
                encoding=None,  # sessions come from Login.session_requested, counted
                agent_forwarding=False,
                x11_forwarding=False,
                login_timeout=LOGIN_TIMEOUT,
                keepalive_interval=KEEPALIVE_SECONDS,
                encryption_algs=CIPHERS,
                signature_algs=SIGNATURE_ALGS,
            )
        except (asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
            log.info("ssh_connection_ended", stream_id=request.stream_id, reason=f"{type(exc).__name__}: {exc}"[:300])
            sock.close()
            return
        self._conn = conn
        missing = await self._login.looked_up()  # its container, now that the signature passed
        if missing:
            conn.disconnect(asyncssh.DISC_BY_APPLICATION, missing)
            await conn.wait_closed()
            return
        container = self._login.container or {}
        log.info(
            "ssh_login",
            stream_id=request.stream_id,
            rental_id=request.rental_id,
            stack_id=self._login.stack_id,
            user=conn.get_extra_info("username"),
            container_id=str(container.get("Id", ""))[:12],
        )
        if self._stopped:
            conn.close()
        await conn.wait_closed()

    async def _locate(self) -> ContainerAt:
        missing = await self._login.looked_up()  # a channel may open before _serve has read it
        container = self._login.container
        if missing or container is None:
            raise ContainerGone(missing or "no container")
        return await self._services.engine.locate(container["Id"])

    async def _session(self, process: asyncssh.SSHServerProcess) -> None:
        refused = self._services.execs.take(self._request.rental_id)  # before any engine call
        if refused:
            log.info("ssh_session_refused", stream_id=self._request.stream_id, reason=refused)
            process.stderr.write(f"cannot start a session: {refused}\r\n".encode())
            process.exit(255)
            return
        try:
            container = await self._locate()
        except EngineError as exc:
            process.stderr.write(f"the container is not available: {exc}\r\n".encode())
            process.exit(255)
            return
        if container.unreachable:  # its machine cannot be reached
            process.stderr.write(f"{container.unreachable}\r\n".encode())
            process.exit(255)
            return
        kind = "shell" if process.command is None else "command"
        log.info(
            "ssh_session", stream_id=self._request.stream_id, kind=kind, tty=process.get_terminal_type() is not None
        )
        await ExecSession(self._services.engine, container.info["Id"]).run(process)

    async def _sftp(self, chan: asyncssh.SSHServerChannel) -> ContainerSFTP:
        # The file helper is a process of the host's, as an exec is: the same rental's bucket pays for it.
        refused = self._services.execs.take(self._request.rental_id)
        if refused:
            log.info("ssh_session_refused", stream_id=self._request.stream_id, kind="files", reason=refused)
            raise ValueError(f"cannot start a session: {refused}")
        try:
            files = await self._services.engine.open_files(await self._locate())
        except (EngineError, OSError, ValueError) as exc:
            log.warning("ssh_files_unavailable", stream_id=self._request.stream_id, error=str(exc)[:300])
            raise
        log.info("ssh_session", stream_id=self._request.stream_id, kind="files")
        return ContainerSFTP(chan, files)


class _CountedProcess(asyncssh.SSHServerProcess):
    """A session channel (a command, a shell, SFTP or SCP) that gives its slot
    back when it closes."""

    def __init__(self, slot: Slot, *args: Any):
        super().__init__(*args)
        self._slot = slot

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            self._slot.release()

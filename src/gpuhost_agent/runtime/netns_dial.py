"""A TCP connection made from inside a container's network namespace.

On one machine a tunnel's last hop dials the container's address on its
bridge network, which the host routes to. A Swarm service's networks are
overlays: their addresses live in the containers' namespaces and the host
has no route to them, on the container's own machine as on any other. So
in a Swarm environment the agent on the container's machine makes the
socket inside the container's network namespace (`setns(2)` on
/proc/<pid>/ns/net, as `nsenter --net` does) and connects from there to the
container's own address. A socket keeps the namespace it was made in, so
only the creation happens inside; connecting and relaying are ordinary.

The switch is made on a thread of its own that ends right after: a thread
left in a container's namespace by a failed switch back would never serve
the agent again. Needs CAP_SYS_ADMIN (the agent runs as root); without it
the error says so.

The pid is the engine's answer to an inspect made a moment before; it is
pinned (runtime/container_process.py): a pidfd first, then the namespace
opened, then the process's cgroups must name the container's id and the
pidfd must still be alive, so a pid recycled in between (a host process,
another renter's container) is refused before the switch. A namespace that
is the agent's own (the host's: a container sharing it) is refused too, so
a dial made here never reaches what only the host's loopback serves; an SSH
`-L localhost:PORT` dials the container's loopback this way
(streams/admission.py, connect_own_loopback), IPv4 or IPv6 as the address is.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import socket
import ssl
import threading

from gpuhost_agent.errors import OutsideFailure
from gpuhost_agent.runtime.container_process import PinnedProcess, ProcessGone
from gpuhost_agent.runtime.engine.streams import SERVICE_READ_LIMIT

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(OutsideFailure, OSError):
    pass


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NetnsError(err, f"setns: {os.strerror(err)}")


def _namespace_of(pid: int, container_id: str) -> int:
    """An fd of the network namespace of `pid`, once the pid is the container's
    and the namespace not the host's."""
    with PinnedProcess(pid, container_id) as process:
        target = process.open("ns/net")
        try:
            process.confirm()
            if _is_hosts(os.fstat(target)):
                raise NetnsError(errno.EPERM, "the container shares the host's network: no connection is made in it")
        except BaseException:
            os.close(target)
            raise
        return target


def _is_hosts(namespace: os.stat_result) -> bool:
    """Whether a namespace is the agent's own or the host's init's (the same
    one, unless the agent runs in a namespace of its own)."""
    for path in ("/proc/self/ns/net", "/proc/1/ns/net"):
        try:
            own = os.stat(path)
        except OSError:
            continue
        if (own.st_dev, own.st_ino) == (namespace.st_dev, namespace.st_ino):
            return True
    return False


def _socket_in(pid: int, container_id: str, family: socket.AddressFamily) -> socket.socket:
    """A TCP socket in the network namespace of process `pid`, the container's."""
    target = _namespace_of(pid, container_id)
    try:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    except OSError:
        os.close(target)
        raise
    try:
        _setns(target)
        try:
            return socket.socket(family, socket.SOCK_STREAM)
        finally:
            _setns(own)  # raises if it fails: the thread ends with the call either way
    finally:
        os.close(target)
        os.close(own)


def _on_own_thread(pid: int, container_id: str, family: socket.AddressFamily) -> socket.socket:
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            made.append(_socket_in(pid, container_id, family))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            failed.append(exc)

    thread = threading.Thread(target=work, name=f"netns-{pid}", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


async def dial_in_namespace(
    pid: int,
    address: str,
    port: int,
    timeout: float,
    tls: ssl.SSLContext | None = None,
    container_id: str = "",
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to address:port from inside the network namespace of `pid`, the
    init of the container `container_id` as inspected (with TLS, unverified as
    the caller's context says, when given one). Without an id (older callers)
    the pid must be some container's, never a host process."""
    if pid <= 0:
        raise NetnsError(0, "the container has no process (not running)")
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = await asyncio.to_thread(_on_own_thread, pid, container_id, family)
    except ProcessGone as exc:
        raise NetnsError(exc.errno or 0, exc.strerror or str(exc)) from None
    except PermissionError as exc:
        raise NetnsError(exc.errno or 0, "entering the container's network needs root (CAP_SYS_ADMIN)") from None
    try:
        sock.setblocking(False)
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (address, port)), timeout)
        return await asyncio.wait_for(
            asyncio.open_connection(sock=sock, limit=SERVICE_READ_LIMIT, ssl=tls, server_hostname="" if tls else None),
            timeout,
        )
    except BaseException:
        sock.close()
        raise

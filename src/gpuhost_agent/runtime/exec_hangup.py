"""Hang up a terminal's exec when its session ends.

Closing an exec's connection does not end the exec: the engine keeps the TTY
open with nobody on it, so every closed browser tab would leave a shell (and
whatever it ran) in the renter's container for good. The Engine API has no
"kill exec", so the agent does what a closing terminal does: SIGHUP to every
process of the exec's session, then SIGKILL to those still there.

This module knows processes, not the engine: EngineStreams.hang_up and
.signal (runtime/engine/streams.py) ask their engine for the exec's and the
container's pids and hand them here. The exec's Pid is a host pid: of the
machine whose engine answered. So this runs there, and a container on
another machine of the environment is hung up by that machine's agent
(runtime/door_client.py). The agent signals it only when the process is in
the container's own pid namespace, and that namespace is not the agent's: an
agent that does not see the host's pids (itself in a container) could
otherwise hit one of its own processes of the same number. Otherwise, or
without the rights, it does nothing; the engine's own cleanup then applies.

Pids are the engine's answers of a moment before, and a pid may be handed to
another process in between. So the container's pid is pinned
(runtime/container_process.py: its cgroups must name the container's id),
its pid namespace read through it, and every process to signal is held by a
pidfd taken before its namespace is checked; signals go through the pidfds,
which cannot reach a process that took over a pid.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.container_process import PinnedProcess

log = get_logger(__name__)

KILL_AFTER = 2.0


def _pid_namespace(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def _session_members(session: int) -> list[int]:
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and int(fields[3]) == session:  # state ppid pgrp session
            members.append(int(name))
    return members


def _alive(pidfd: int) -> bool:
    """Not exited: a pidfd is readable once its process has (a zombie too: its
    parent may be a PID 1 that reaps nothing)."""
    return not select.select([pidfd], [], [], 0)[0]


def _real_pids(exec_pid: object, container_pid: object) -> tuple[int, int] | None:
    """Both as pids, when the engine reported real ones (not missing, not 0 or 1)."""
    if isinstance(exec_pid, int) and isinstance(container_pid, int) and exec_pid > 1 and container_pid > 1:
        return exec_pid, container_pid
    return None


def _container_namespace(container_pid: int, container_id: str) -> int | None:
    """The container's pid namespace (its pid confirmed the container's), when
    it is not the agent's; else None."""
    try:
        with PinnedProcess(container_pid, container_id) as container:
            fd = container.open("ns/pid")
            try:
                namespace = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            container.confirm()
    except OSError:
        return None
    return None if namespace == _pid_namespace("self") else namespace


def _pinned(pid: int, namespace: int) -> int | None:
    """A pidfd of `pid`, when that process is alive in the pid namespace `namespace`."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    if _pid_namespace(pid) == namespace and _alive(pidfd):
        return pidfd
    os.close(pidfd)
    return None


def _session(exec_pid: int, container_pid: int, container_id: str) -> list[int]:
    """pidfds of the processes of the exec's session, when it is safe to signal them."""
    namespace = _container_namespace(container_pid, container_id)
    leader = _pinned(exec_pid, namespace) if namespace is not None else None
    if namespace is None or leader is None:
        return []
    os.close(leader)
    found = (_pinned(pid, namespace) for pid in _session_members(exec_pid))
    return [pidfd for pidfd in found if pidfd is not None]


def _signal(pidfds: list[int], signum: int) -> list[int]:
    """Those of `pidfds` whose process was there to get the signal (the others are closed)."""
    alive = []
    for pidfd in pidfds:
        try:
            signal.pidfd_send_signal(pidfd, signum)
            alive.append(pidfd)
        except OSError:
            os.close(pidfd)
    return alive


def signal_exec(exec_pid: object, container_pid: object, signum: int, container_id: str = "") -> bool:
    """Send `signum` to an exec's own process (an SSH client's signal request),
    under the same namespace rule as hang_up. Whether it was sent."""
    pids = _real_pids(exec_pid, container_pid)
    namespace = _container_namespace(pids[1], container_id) if pids else None
    pidfd = _pinned(pids[0], namespace) if pids and namespace is not None else None
    if pidfd is None:
        return False
    sent = _signal([pidfd], signum)
    for each in sent:
        os.close(each)
    return bool(sent)


async def hang_up(
    exec_pid: object, container_pid: object, *, container_id: str = "", kill_after: float = KILL_AFTER
) -> None:
    """SIGHUP the exec's session, SIGKILL what is left of it after `kill_after`."""
    pids = _real_pids(exec_pid, container_pid)
    if pids is None:
        return
    members = await asyncio.to_thread(_session, *pids, container_id)
    alive = _signal(members, signal.SIGHUP)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + kill_after
    try:
        while alive and loop.time() < deadline:
            await asyncio.sleep(0.1)
            for gone in [pidfd for pidfd in alive if not _alive(pidfd)]:
                alive.remove(gone)
                os.close(gone)
        if alive:
            alive = _signal(alive, signal.SIGKILL)
            log.debug("terminal_session_killed", processes=len(alive))
    finally:
        for pidfd in alive:
            os.close(pidfd)

"""Hang up a terminal's exec when its session ends.

Closing an exec's connection does not end the exec: the engine keeps the TTY
open with nobody on it, so every closed browser tab would leave a shell (and
whatever it ran) in the renter's container for good. The Engine API has no
"kill exec", so the agent does what a closing terminal does: SIGHUP to every
process of the exec's session, then SIGKILL to those still there.

The exec's Pid is a host pid: of the machine whose engine answered. So this
runs there, and in a Swarm environment a container on another machine is hung
up by that machine's agent (runtime/door_client.py). The agent signals it only when the process is in
the container's own pid namespace, and that namespace is not the agent's: an
agent that does not see the host's pids (itself in a container) could
otherwise hit one of its own processes of the same number. Otherwise, or
without the rights, it does nothing; the engine's own cleanup then applies.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import TYPE_CHECKING

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.engine import EngineError

if TYPE_CHECKING:  # EngineStreams calls in here: its hang_up and signal
    from gpuhost_agent.runtime.engine_streams import EngineStreams

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


def _running(pid: int) -> bool:
    """Still there, and not a zombie (its parent may be a PID 1 that reaps nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _real_pids(exec_pid: object, container_pid: object) -> tuple[int, int] | None:
    """Both as pids, when the engine reported real ones (not missing, not 0 or 1)."""
    if isinstance(exec_pid, int) and isinstance(container_pid, int) and exec_pid > 1 and container_pid > 1:
        return exec_pid, container_pid
    return None


def _container_namespace(exec_pid: int, container_pid: int) -> int | None:
    """The exec's pid namespace when it is the container's and not the agent's
    (only then is the exec's pid safe to signal), else None."""
    namespace = _pid_namespace(exec_pid)
    if namespace is None or namespace != _pid_namespace(container_pid) or namespace == _pid_namespace("self"):
        return None
    return namespace


def _session(exec_pid: int, container_pid: int) -> list[int]:
    """The processes of the exec's session, when it is safe to signal them."""
    namespace = _container_namespace(exec_pid, container_pid)
    if namespace is None:
        return []
    return [pid for pid in _session_members(exec_pid) if _pid_namespace(pid) == namespace]


def _signal(pids: list[int], signum: int) -> list[int]:
    """Those of `pids` that were there to get the signal."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, signum)
            alive.append(pid)
        except OSError:
            pass
    return alive


def signal_exec(exec_pid: object, container_pid: object, signum: int) -> bool:
    """Send `signum` to an exec's own process (an SSH client's signal request),
    under the same namespace rule as hang_up. Whether it was sent."""
    pids = _real_pids(exec_pid, container_pid)
    if pids is None or _container_namespace(*pids) is None:
        return False
    return bool(_signal([pids[0]], signum))


async def hang_up(exec_pid: object, container_pid: object, *, kill_after: float = KILL_AFTER) -> None:
    """SIGHUP the exec's session, SIGKILL what is left of it after `kill_after`."""
    pids = _real_pids(exec_pid, container_pid)
    if pids is None:
        return
    members = await asyncio.to_thread(_session, *pids)
    alive = _signal(members, signal.SIGHUP)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + kill_after
    while alive and loop.time() < deadline:
        await asyncio.sleep(0.1)
        alive = [pid for pid in alive if _running(pid)]
    if alive:  # a pid reused within kill_after is not a real risk: pids wrap far slower
        log.debug("terminal_session_killed", processes=len(_signal(alive, signal.SIGKILL)))


async def hang_up_exec(engine: EngineStreams, exec_id: str, container_id: str) -> None:
    """A session ended with its command still running: end the command."""
    try:
        state = await engine.exec_inspect(exec_id)
        if state.get("Running"):
            container = await engine.inspect(container_id)
            await hang_up(state.get("Pid"), (container.get("State") or {}).get("Pid"))
    except EngineError:
        pass  # the container is gone, or the engine: nothing left to hang up


async def signal_exec_of(engine: EngineStreams, exec_id: str, container_id: str, signum: int) -> bool:
    """signal_exec with the pids the engine reports; False when it cannot tell."""
    try:
        state = await engine.exec_inspect(exec_id)
        container = await engine.inspect(container_id)
    except EngineError:
        return False
    return await asyncio.to_thread(signal_exec, state.get("Pid"), (container.get("State") or {}).get("Pid"), signum)

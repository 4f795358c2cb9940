"""A container's files, through a helper confined to the container (runtime/files_jail.py).

SFTP and SCP must work in an image with no tools at all, and must never reach
a host file. Docker's archive API (what `docker cp` uses) works without tools
but can only copy whole trees, so listing `/` would copy the container. The
helper instead does plain file operations, one at a time, on the container's
root as a directory fd (never entering its mount namespace: nothing of the
container is ever loaded), within its cgroups, user and capabilities: whatever
a path or symlink says, the kernel resolves it in the container's root.

One helper per SFTP session, started when the session starts and ended with
it, on the container's machine: in a Swarm environment the worker's agent
starts it and relays its pipes to the leader (streams/door.py).
Calls are serialised (the helper serves one at a time) and each is bounded
in time; an error the helper reports comes back as the OSError it
was, so asyncssh answers the client with the matching SFTP status.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from gpuhost_agent.errors import OutsideFailure
from gpuhost_agent.runtime.files_ops import FRAME, MAX_ANSWER, MAX_DATA, MAX_JSON

CALL_TIMEOUT = 30.0
START_TIMEOUT = 10.0
HELPER = (sys.executable, "-I", "-m", "gpuhost_agent.runtime.files_jail")


class FilesUnavailable(OutsideFailure, OSError):
    """The helper could not start or confine itself; the message says why."""


async def start_helper(container_pid: int, user: str, container_id: str = "") -> asyncio.subprocess.Process:
    """The helper for the container `container_id` whose init is `container_pid`
    (a host pid, as inspected), as the container's `user` (Docker's
    Config.User), speaking on its stdin and stdout. The helper refuses a pid
    whose cgroups do not name that container (the pid was recycled); without
    an id (older callers) it refuses only a pid of no container at all.
    A Swarm worker's door relays its pipes to the leader."""
    if os.geteuid() != 0:
        raise FilesUnavailable(errno.EPERM, "file transfer needs the agent to run as root")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    return await asyncio.create_subprocess_exec(
        *HELPER,
        str(container_pid),
        user,
        container_id,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )


async def end_helper(process: asyncio.subprocess.Process) -> None:
    """Its stdin closed, it ends; one that does not within 2 s is killed."""
    if process.returncode is None:
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 2)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()


class ContainerFiles:
    """One helper's calls, over its pipes (on this machine) or over the door
    of the container's machine's agent (a Swarm worker's, which relays them)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, end: Callable[[], Awaitable[None]]):
        self._reader, self._writer, self._end = reader, writer, end
        self._ended = False
        self._lock = asyncio.Lock()
        self.home = "/"

    @classmethod
    async def start(cls, container_pid: int, user: str, container_id: str = "") -> ContainerFiles:
        """A helper on this machine (see start_helper)."""
        process = await start_helper(container_pid, user, container_id)
        assert process.stdout is not None and process.stdin is not None
        return await cls._opened(process.stdout, process.stdin, partial(end_helper, process))

    @classmethod
    async def over(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> ContainerFiles:
        """A helper on another machine, behind a connection its agent relays."""

        async def end() -> None:
            writer.close()

        return await cls._opened(reader, writer, end)

    @classmethod
    async def _opened(
        cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, end: Callable[[], Awaitable[None]]
    ) -> ContainerFiles:
        """Once the helper has said it is confined (its first answer: the user's home)."""
        files = cls(reader, writer, end)
        try:
            home, _ = await asyncio.wait_for(files._answer(), START_TIMEOUT)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            await files.close()
            raise FilesUnavailable(errno.EPERM, getattr(exc, "strerror", None) or str(exc) or "helper failed") from None
        files.home = str(home)
        return files

    async def call(self, op: str, *args: Any, data: bytes = b"") -> tuple[Any, bytes]:
        """(result, data) of one operation; raises OSError as the helper reported it."""
        request = json.dumps({"op": op, "args": list(args)}).encode()
        if len(request) > MAX_JSON or len(data) > MAX_DATA:
            raise OSError(errno.E2BIG, "request too large")
        async with self._lock:
            if self._ended:
                raise OSError(errno.EIO, "the file session has ended")
            try:
                self._writer.write(FRAME.pack(len(request), len(data)) + request + data)
                await self._writer.drain()
                return await asyncio.wait_for(self._answer(), CALL_TIMEOUT)
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as exc:
                await self.close()
                raise OSError(errno.EIO, f"the file helper stopped: {type(exc).__name__}") from None

    async def _answer(self) -> tuple[Any, bytes]:
        """One answer; one that is not as the helper writes them (relayed by
        another machine's agent in a Swarm) is a ValueError."""
        stdout = self._reader
        json_length, data_length = FRAME.unpack(await stdout.readexactly(FRAME.size))
        if json_length > MAX_ANSWER or data_length > MAX_DATA:
            raise ValueError("the helper's answer is too large")
        try:
            answer = json.loads((await stdout.readexactly(json_length)).decode("utf-8"))
        except RecursionError:
            raise ValueError("the helper's answer is not JSON") from None
        if not isinstance(answer, dict):
            raise ValueError("the helper's answer is not an object")
        data = await stdout.readexactly(data_length) if data_length else b""
        if "errno" in answer:
            code = answer["errno"]
            code = code if isinstance(code, int) and not isinstance(code, bool) and 0 < code < 4096 else errno.EIO
            raise OSError(code, str(answer.get("error", ""))[:300])
        return answer.get("ok"), data

    async def close(self) -> None:
        if not self._ended:
            self._ended = True
            await self._end()

"""A container's files, through a helper confined to the container (runtime/files_jail.py).

SFTP and SCP must work in an image with no tools at all, and must never reach
a host file. Docker's archive API (what `docker cp` uses) works without tools
but can only copy whole trees, so listing `/` would copy the container. The
helper instead does plain file operations, one at a time, from inside the
container's mount namespace, cgroups, user and capabilities: whatever a path
or symlink says, it is resolved in the container's root.

One helper per SFTP session, started when the session starts and ended with
it. Calls are serialised (the helper serves one at a time) and each is
bounded in time; an error the helper reports comes back as the OSError it
was, so asyncssh answers the client with the matching SFTP status.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sys
from typing import Any

from gpuhost_agent.runtime.files_ops import FRAME, MAX_DATA, MAX_JSON

CALL_TIMEOUT = 30.0
START_TIMEOUT = 10.0
HELPER = (sys.executable, "-I", "-m", "gpuhost_agent.runtime.files_jail")


class FilesUnavailable(OSError):
    """The helper could not start or confine itself; the message says why."""


class ContainerFiles:
    def __init__(self, process: asyncio.subprocess.Process, home: str):
        self._process = process
        self._lock = asyncio.Lock()
        self.home = home

    @classmethod
    async def start(cls, container_pid: int, user: str) -> ContainerFiles:
        """A helper in the container whose init is `container_pid` (a host pid),
        as the container's `user` (Docker's Config.User)."""
        if os.geteuid() != 0:
            raise FilesUnavailable(errno.EPERM, "file transfer needs the agent to run as root")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        process = await asyncio.create_subprocess_exec(
            *HELPER,
            str(container_pid),
            user,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
        )
        files = cls(process, "/")
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
            stdin = self._process.stdin
            if stdin is None or self._process.returncode is not None:
                raise OSError(errno.EIO, "the file session has ended")
            try:
                stdin.write(FRAME.pack(len(request), len(data)) + request + data)
                await stdin.drain()
                return await asyncio.wait_for(self._answer(), CALL_TIMEOUT)
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as exc:
                await self.close()
                raise OSError(errno.EIO, f"the file helper stopped: {type(exc).__name__}") from None

    async def _answer(self) -> tuple[Any, bytes]:
        stdout = self._process.stdout
        assert stdout is not None
        json_length, data_length = FRAME.unpack(await stdout.readexactly(FRAME.size))
        if json_length > MAX_JSON or data_length > MAX_DATA:
            raise ValueError("the helper's answer is too large")
        answer = json.loads(await stdout.readexactly(json_length))
        data = await stdout.readexactly(data_length) if data_length else b""
        if "errno" in answer:
            raise OSError(int(answer["errno"]), str(answer.get("error", "")))
        return answer.get("ok"), data

    async def close(self) -> None:
        if self._process.returncode is None:
            if self._process.stdin is not None:
                self._process.stdin.close()
            try:
                await asyncio.wait_for(self._process.wait(), 2)
            except asyncio.TimeoutError:
                self._process.kill()
                await self._process.wait()

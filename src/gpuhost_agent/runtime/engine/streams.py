"""The Docker Engine's long streams, read with asyncio: container logs and TTY execs.

Logs are read with aiohttp straight from the Engine API, in 64 KiB chunks:
docker-py reads one frame per urllib3 call (16.5 s for 2.4M lines against 9.4 s
this way, `docker logs` itself 13.7 s), and a blocking read would need a
thread per stream. aiohttp's reader pauses the socket when its buffer is full,
so a caller that stops reading stops the engine read: backpressure for free.

A TTY exec is an HTTP/1.1 upgrade ("hijack") of one request, done by hand over
an asyncio connection: docker-py's hijacked socket comes out of http.client,
whose buffered reader may already hold the first output bytes (lost), and is
reached only through private attributes. Here the bytes after the response
head stay in the StreamReader, and no terminal needs a thread.

Every failure leaves this module as an EngineError: ContainerGone for a
container (or exec) the engine does not know, EngineUnreachable when it did
not answer at all, plain EngineError when it answered with an error.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections import OrderedDict
from collections.abc import Awaitable

import aiohttp

from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime import exec_hangup
from gpuhost_agent.runtime.container_at import ContainerAt
from gpuhost_agent.runtime.container_files import ContainerFiles
from gpuhost_agent.runtime.docker_host import parse_docker_host
from gpuhost_agent.runtime.engine.calls import EngineCalls, checked_id
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.errors import ContainerGone, EngineUnreachable
from gpuhost_agent.runtime.engine.errors import response_error as _error
from gpuhost_agent.runtime.engine.records import ContainerSummary
from gpuhost_agent.runtime.engine.upgrade import upgrade_request, upgraded

__all__ = [
    "ContainerAt",
    "ContainerGone",
    "EngineStreams",
    "EngineUnreachable",
    "LogReader",
    "checked_id",
    "parse_docker_host",
]

CHUNK_BYTES = 64 * 1024
SERVICE_READ_LIMIT = 256 * 1024  # a tunnel's service connection: streams/tunnel.py's CHUNK
NETWORKS_KEPT = 256  # network inspects kept by id (EngineStreams.network)
EXIT_POLL_FIRST, EXIT_POLL_MOST = 0.05, 1.0  # seconds between inspections of an ended exec


class LogReader:
    """One open log response. read() returns b"" at the end."""

    def __init__(self, response: aiohttp.ClientResponse, chunk_bytes: int):
        self._response = response
        self._chunk = chunk_bytes

    async def read(self) -> bytes:
        try:
            return await self._response.content.read(self._chunk)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise EngineUnreachable(f"the log stream broke: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self._response.close()


class EngineStreams(EngineCalls):
    """The engine's streams, on the agent's HTTP client of the engine
    (runtime/engine/calls.py); DOCKER_HOST is read on first use, and a bad
    one fails each call."""

    def __init__(self, docker_host: str | None = None, *, timeout: float = 30, headers: dict[str, str] | None = None):
        super().__init__(docker_host, timeout=timeout, headers=headers)
        self._networks: OrderedDict[str, dict] = OrderedDict()  # network inspects by id: network()

    async def inspect(self, container_id: str) -> dict:
        """`docker inspect`: Config.Tty, Config.Labels, State, Id."""
        return await self._inspect_here(container_id)

    async def locate(self, container_id: str) -> ContainerAt:
        """The container's inspect and where it runs: on one machine, here."""
        return ContainerAt(await self._inspect_here(container_id))

    async def network(self, network_id: str) -> dict:
        """`docker network inspect`: Labels and IPAM.Config, which a tunnel's
        last hop is judged on (streams/sandbox_addresses.py). Both are fixed
        when a network is made and an id is never given twice, so an
        inspect is kept by full id (the last NETWORKS_KEPT): each new tunnel
        connection then costs one engine call, the container's inspect,
        which says whether it is still on that network."""
        kept = self._networks.get(network_id)
        if kept is not None:
            self._networks.move_to_end(network_id)
            return kept
        reply = await self._call("GET", f"/networks/{checked_id(network_id)}")
        if not isinstance(reply, dict):
            raise EngineError("Docker Engine answered a network inspect without an object")
        if reply.get("Id") == network_id:  # asked by its full id, as a container's inspect names it
            self._networks[network_id] = reply
            while len(self._networks) > NETWORKS_KEPT:
                self._networks.popitem(last=False)
        return reply

    async def open_logs(
        self, container_id: str, *, follow: bool, tail: int | None, since: str | None, chunk_bytes: int = CHUNK_BYTES
    ) -> LogReader:
        """Both streams, always with timestamps (the pump needs them to resume).
        No overall timeout: a follow may idle for days."""
        path = f"/containers/{checked_id(container_id)}/logs"
        return await self._open_log(path, follow=follow, tail=tail, since=since, chunk_bytes=chunk_bytes)

    async def _open_log(
        self, path: str, *, follow: bool, tail: int | None, since: str | None, chunk_bytes: int
    ) -> LogReader:
        """A log stream of the engine's (a container's, or a Swarm task's: runtime/swarm_streams.py)."""
        params = {
            "stdout": "1",
            "stderr": "1",
            "timestamps": "1",
            "follow": "1" if follow else "0",
            "tail": "all" if tail is None else str(tail),
        }
        if since is not None:
            params["since"] = since
        try:
            response = await self._session().get(
                path,
                params=params,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeout),
            )
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise EngineUnreachable(f"Docker Engine unreachable: {type(exc).__name__}: {exc}") from exc
        if response.status >= 400:
            try:
                raise await _error(response)
            finally:
                response.close()
        return LogReader(response, chunk_bytes)

    async def containers(self, labels: dict[str, str]) -> list[ContainerSummary]:
        """`docker ps -a` of the containers carrying every one of `labels`."""
        return await self._containers_here([f"{key}={value}" for key, value in labels.items()])

    async def stack_containers(self, stack_id: str) -> list[ContainerSummary]:
        """The stack's containers on this machine's engine, by the agent's label."""
        return await self.containers({wire.LABEL_STACK: stack_id})

    async def exec_create(self, container_id: str, command: list[str], env: dict[str, str], *, tty: bool = True) -> str:
        """An exec in the container's own user and working directory. Without a
        TTY its output comes in Docker's multiplexed frames (stdout and stderr
        apart), and closing the connection's sending side closes its stdin."""
        body = {
            "AttachStdin": True,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": tty,
            "Cmd": list(command),
            "Env": [f"{k}={v}" for k, v in env.items()],
        }
        reply = await self._call("POST", f"/containers/{checked_id(container_id)}/exec", body=body)
        if not isinstance(reply, dict) or not isinstance(reply.get("Id"), str):
            raise EngineError("Docker Engine created an exec without an Id")
        return reply["Id"]

    async def exec_start(self, exec_id: str, *, tty: bool = True) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Start the exec and take over its connection: what follows the
        response head is the TTY (or the frames), both ways."""
        body = json.dumps({"Detach": False, "Tty": tty}).encode()
        return await self._upgrade(f"/exec/{checked_id(exec_id)}/start", body, "exec start")

    async def _upgrade(self, path: str, body: bytes, what: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """POST with `Upgrade: tcp`; on 101 or 200, the raw connection both ways."""
        self._session()  # reads DOCKER_HOST
        endpoint = self._endpoint
        assert endpoint is not None
        head = upgrade_request(path, "docker", self._headers, body)

        def connect() -> Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
            if endpoint.unix_path:
                return asyncio.open_unix_connection(endpoint.unix_path)
            return asyncio.open_connection(endpoint.host, endpoint.port)

        return await upgraded(
            connect, lambda writer: writer.write(head), timeout=self._timeout, failed=f"Docker Engine: {what} failed"
        )

    async def dial(
        self, container: ContainerAt, address: str, port: int, *, tls: ssl.SSLContext | None, timeout: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A tunnel's last hop (streams/tunnel.py): the host routes to a bridge network's addresses."""
        hostname = "" if tls else None
        return await asyncio.wait_for(
            asyncio.open_connection(address, port, limit=SERVICE_READ_LIMIT, ssl=tls, server_hostname=hostname), timeout
        )

    async def hang_up(self, exec_id: str, container_id: str) -> None:
        """A session ended with its command still running: end the command
        (runtime/exec_hangup.py says how, and why only on the exec's machine)."""
        try:
            state = await self.exec_inspect(exec_id)
            if state.get("Running"):
                pid, cid = await self._container_pid(container_id)
                await exec_hangup.hang_up(state.get("Pid"), pid, container_id=cid)
        except EngineError:
            pass  # the container is gone, or the engine: nothing left to hang up

    async def signal(self, exec_id: str, container_id: str, signum: int) -> bool:
        """An SSH client's signal to the exec's process; whether it was sent
        (False when the engine cannot tell its pids)."""
        try:
            state = await self.exec_inspect(exec_id)
            pid, cid = await self._container_pid(container_id)
        except EngineError:
            return False
        return await asyncio.to_thread(exec_hangup.signal_exec, state.get("Pid"), pid, signum, cid)

    async def _container_pid(self, container_id: str) -> tuple[object, str]:
        """The container's main pid as this machine's engine reports it, and its full id."""
        container = await self.inspect(container_id)
        return (container.get("State") or {}).get("Pid"), str(container.get("Id") or "")

    async def open_files(self, container: ContainerAt) -> ContainerFiles:
        """SFTP's file helper in the container (runtime/container_files.py)."""
        state, config = container.info.get("State") or {}, container.info.get("Config") or {}
        return await ContainerFiles.start(int(state.get("Pid") or 0), str(config.get("User") or ""), container.id)

    async def exec_resize(self, exec_id: str, *, rows: int, cols: int) -> None:
        await self._call("POST", f"/exec/{checked_id(exec_id)}/resize", params={"h": str(rows), "w": str(cols)})

    async def exec_inspect(self, exec_id: str) -> dict:
        reply = await self._call("GET", f"/exec/{checked_id(exec_id)}/json")
        return reply if isinstance(reply, dict) else {}

    async def exec_exit_code(self, exec_id: str, wait: float) -> int | None:
        """The exec's exit code once its output ended: the engine records it a
        moment after the stream closes, so it is polled for up to `wait` s,
        at growing intervals (a command that closed its output and runs on
        cost 100 inspections in 5 s; about 10 now). None: still running."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        pause = EXIT_POLL_FIRST
        while True:
            try:
                state = await self.exec_inspect(exec_id)
            except EngineError:
                return None
            if not state.get("Running") or loop.time() > deadline:
                code = state.get("ExitCode")
                return code if isinstance(code, int) and not state.get("Running") else None
            await asyncio.sleep(min(pause, max(0.0, deadline - loop.time()) + 0.001))
            pause = min(pause * 2, EXIT_POLL_MOST)

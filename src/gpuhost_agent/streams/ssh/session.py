"""One SSH session channel: a Docker exec in the chosen container.

`ssh host` is a shell with a PTY, `ssh host cmd` runs `/bin/sh -c cmd` and
returns its exit status, `ssh -tt` gives a command a PTY. Without a PTY the
engine keeps stdout and stderr apart (multiplexed frames), so a renter's
`2>/dev/null` works as on any SSH server; the client's EOF half-closes the
exec's connection, which closes the command's stdin (`ssh host wc -c < f`).
Window changes resize the exec's TTY; a signal request is delivered to the
exec's process (inside the container's pid namespace only,
runtime.exec_hangup). A session that ends before its command does hangs the
command up, as a closing terminal does.

Environment from the client (`SendEnv`, `ssh -o SetEnv`) is passed on when
the names are ordinary variable names, at most 64 of them.
"""

from __future__ import annotations

import asyncio
import re
import signal
import struct

import asyncssh

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.streams.frames import STDERR

log = get_logger(__name__)

READ_BYTES = 64 * 1024
EXIT_CODE_WAIT = 5.0
SHELL = "/bin/sh"
MAX_ENV = 64
MAX_ENV_VALUE = 4096
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_FRAME = struct.Struct(">BxxxL")  # stream (1 stdout, 2 stderr), then the length


def exec_command(command: str | None) -> list[str]:
    return [SHELL, "-c", command] if command else [SHELL]


def exec_env(client_env: dict, term: str | None) -> dict[str, str]:
    """The client's variables that may pass (plain names, bounded), and TERM for a PTY."""
    env: dict[str, str] = {}
    for name, value in list(client_env.items())[:MAX_ENV]:
        if isinstance(name, str) and isinstance(value, str) and _ENV_NAME.match(name) and len(value) <= MAX_ENV_VALUE:
            if "\x00" not in value and not name.startswith("NVIDIA_"):
                env[name] = value
    if term:
        env["TERM"] = term
    return env


class ExecSession:
    def __init__(self, engine: EngineStreams, container_id: str):
        self._engine = engine
        self._container = container_id
        self._exec_id: str | None = None

    async def run(self, process: asyncssh.SSHServerProcess) -> None:
        term = process.get_terminal_type()
        tty = term is not None
        if process.subsystem:
            process.stderr.write(f"subsystem {process.subsystem!r} is not offered here\r\n".encode())
            process.exit(1)
            return
        try:
            self._exec_id = await self._engine.exec_create(
                self._container, exec_command(process.command), exec_env(dict(process.env), term), tty=tty
            )
            reader, writer = await self._engine.exec_start(self._exec_id, tty=tty)
        except EngineError as exc:
            process.stderr.write(f"cannot start a session in the container: {exc}\r\n".encode())
            process.exit(255)
            return
        if tty:
            width, height, _, _ = process.get_terminal_size()
            await self._resize(width, height)
        output = asyncio.create_task(self._output(reader, process, tty))
        inputs = asyncio.create_task(self._input(process, writer))
        closed = asyncio.create_task(process.wait_closed())
        try:
            await asyncio.wait({output, closed}, return_when=asyncio.FIRST_COMPLETED)
            if output.done() and not closed.done():
                code = await self._engine.exec_exit_code(self._exec_id, EXIT_CODE_WAIT)
                if code is None:  # its output ended and it runs on: no session holds it, so it ends
                    await self._engine.hang_up(self._exec_id, self._container)
                process.exit(code if code is not None else 255)
            else:
                await self._engine.hang_up(self._exec_id, self._container)
        finally:
            writer.close()
            for task in (output, inputs, closed):
                task.cancel()
            await asyncio.gather(output, inputs, closed, return_exceptions=True)

    async def _output(self, reader: asyncio.StreamReader, process: asyncssh.SSHServerProcess, tty: bool) -> None:
        """Until the exec's output ends."""
        try:
            if tty:
                while data := await reader.read(READ_BYTES):
                    process.stdout.write(data)
                    await process.stdout.drain()
                return
            while True:
                kind, length = _FRAME.unpack(await reader.readexactly(_FRAME.size))
                data = await reader.readexactly(length)
                out = process.stderr if kind == STDERR else process.stdout
                out.write(data)
                await out.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            return

    async def _input(self, process: asyncssh.SSHServerProcess, writer: asyncio.StreamWriter) -> None:
        """Keys and data to the exec; window changes and signals to the engine."""
        while True:
            try:
                data = await process.stdin.read(READ_BYTES)
            except asyncssh.TerminalSizeChanged as change:
                await self._resize(change.width, change.height)
                continue
            except asyncssh.SignalReceived as received:
                await self._signal(received.signal)
                continue
            except asyncssh.BreakReceived:
                continue
            except (asyncssh.Error, ConnectionError, OSError):
                return
            try:
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()  # the command's stdin closes
                    return
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                return

    async def _resize(self, cols: int, rows: int) -> None:
        if self._exec_id is None or not (0 < cols <= 1000 and 0 < rows <= 1000):
            return
        try:
            await self._engine.exec_resize(self._exec_id, rows=rows, cols=cols)
        except EngineError as exc:
            log.debug("ssh_resize_failed", error=str(exc))

    async def _signal(self, name: str) -> None:
        signum = getattr(signal, f"SIG{name}", None)
        if self._exec_id is not None and isinstance(signum, signal.Signals):
            await self._engine.signal(self._exec_id, self._container, signum)

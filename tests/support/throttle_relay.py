"""A TCP relay on 127.0.0.1 to the test registry that limits the registry's
bytes per second and can stall (stop passing bytes, holding the
connections): a slow or hung registry as the engine meets it. Counts the
connections and the bytes it passed to the client, so a test can tell one
pull from two."""

from __future__ import annotations

import asyncio
import contextlib


class ThrottleRelay:
    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 5000), *, bytes_per_second: int = 10_000_000):
        self.target, self.rate = target, bytes_per_second
        self.connections = 0
        self.bytes_down = 0
        self.flowing = asyncio.Event()
        self.flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stall(self) -> None:
        self.flowing.clear()

    async def __aenter__(self) -> ThrottleRelay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(self._pipe(reader, up_writer, False), self._pipe(up_reader, writer, True))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, down: bool) -> None:
        loop = asyncio.get_running_loop()
        started, passed = loop.time(), 0
        while data := await reader.read(16384):
            if down:
                await self.flowing.wait()
                passed += len(data)
                self.bytes_down += len(data)
                ahead = passed / self.rate - (loop.time() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            writer.write(data)
            await writer.drain()
        writer.write_eof() if writer.can_write_eof() else None

"""HTTP/1.1 over a unix socket with the standard library alone, for the two
blocking callers that need no more: an image pull's thread, which reads the
engine's `POST /images/create` (runtime/image_pull.py), and `gpuhost-agent
status`, which asks the running agent's status socket (service/status/cli.py).
Neither wants aiohttp's loop or docker-py's requests for one request."""

from __future__ import annotations

import http.client
import socket


class UnixHTTPConnection(http.client.HTTPConnection):
    """`http.client`'s connection, dialled to the socket at `path`. The connect
    waits at most `connect_timeout` (the whole `timeout` when None), then
    reads wait `timeout`; the socket is closed when the connect fails."""

    def __init__(self, path: str, timeout: float, *, connect_timeout: float | None = None, host: str = "localhost"):
        super().__init__(host, timeout=timeout)
        self._path = path
        self._connect_timeout = timeout if connect_timeout is None else connect_timeout

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self._connect_timeout)
            sock.connect(self._path)
            sock.settimeout(self.timeout)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

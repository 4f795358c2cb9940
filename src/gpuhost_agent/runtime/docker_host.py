"""Where the Docker Engine listens, from DOCKER_HOST, for the agent's own
HTTP client of the engine (runtime/engine/streams.py): unix:// and plain
tcp://, the others refused by name."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from gpuhost_agent.runtime.engine.errors import EngineError

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


@dataclass(frozen=True)
class Endpoint:
    """Where the engine listens, from DOCKER_HOST."""

    unix_path: str | None = None
    host: str = "docker"
    port: int = 80

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def parse_docker_host(value: str | None, tls: bool = False) -> Endpoint:
    """unix:// (the default) and tcp:// (plain HTTP). TLS, ssh:// and npipe://
    are refused by name rather than tried and failed obscurely."""
    value = value or DEFAULT_DOCKER_HOST
    if value.startswith("unix://"):
        path = value[len("unix://") :]
        if not path.startswith("/"):
            raise EngineError(f"DOCKER_HOST={value!r}: a unix:// address needs an absolute socket path")
        return Endpoint(unix_path=path)
    if value.startswith("tcp://"):
        if tls:
            raise EngineError(
                f"DOCKER_HOST={value!r} with DOCKER_TLS_VERIFY: log and terminal streams"
                " support only unix:// and plain tcp:// engines"
            )
        parts = urllib.parse.urlsplit("http://" + value[len("tcp://") :])
        try:
            port = parts.port or 2375
        except ValueError:
            port = None
        if not parts.hostname or port is None:
            raise EngineError(f"DOCKER_HOST={value!r}: not a tcp://host:port address")
        return Endpoint(host=parts.hostname, port=port)
    raise EngineError(f"DOCKER_HOST={value!r}: log and terminal streams support only unix:// and tcp:// engines")

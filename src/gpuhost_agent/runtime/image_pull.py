"""One image pulled through the engine's API, its events streamed (the
adapter for core/images/pulls.py).

`docker pull`'s own endpoint, `POST /images/create`, with an empty
credential header: a renter's pull never uses registry credentials the host
keeps (a client that reads ~/.docker/config.json, as docker-py or Compose
without the agent's own DOCKER_CONFIG, would send those). The request is
read with a socket timeout of the stall bound: an engine that sends nothing
for that long (its registry sends no byte) ends the request, and closing it
cancels the engine's pull, so nothing half-fetched stays registered and a
retry starts afresh. Events that come without a byte moving (a layer
`Waiting`, a `Retrying in 5 seconds`) do not reset the bound:
`progress_mark` says what counts.

It blocks, in a thread of its own (core/images/pulls.py): the standard
library's HTTP client on the engine's socket, so a pull that runs for an hour
holds no task of the agent's loop.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import time
import urllib.parse
from collections.abc import Callable

from gpuhost_agent.common.unix_http import UnixHTTPConnection
from gpuhost_agent.errors import OutsideFailure
from gpuhost_agent.runtime.docker_host import Endpoint, parse_docker_host
from gpuhost_agent.runtime.engine.errors import EngineError, error_message
from gpuhost_agent.runtime.engine.records import PullEvent

CONNECT_SECONDS = 10.0
NO_CREDENTIAL = base64.urlsafe_b64encode(b"{}").decode()  # X-Registry-Auth of an empty auth config
EVENT_LINE_LIMIT = 1024 * 1024


class PullStalled(OutsideFailure, RuntimeError):
    """No byte moved for the stall bound."""


class PullError(OutsideFailure, RuntimeError):
    """The engine refused the pull or the registry failed it; the message is the engine's."""


def repository_and_tag(reference: str) -> tuple[str, str]:
    """`fromImage` and `tag` of `POST /images/create`: a digest stays in the
    name (`name@sha256:...`, tag empty); a tag follows the last ':' that
    comes after the last '/' (a registry's port is not a tag)."""
    if "@" in reference:
        return reference, ""
    name, sep, tag = reference.rpartition(":")
    if sep and "/" not in tag:
        return name, tag
    return reference, "latest"


def _connection(endpoint: Endpoint, stall_seconds: float) -> http.client.HTTPConnection:
    if endpoint.unix_path:
        return UnixHTTPConnection(endpoint.unix_path, stall_seconds, connect_timeout=CONNECT_SECONDS, host="docker")
    return http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=stall_seconds)


def pull_image(
    reference: str,
    on_event: Callable[[PullEvent], object],
    progress_mark: Callable[[], object],
    stall_seconds: float,
) -> None:
    """Blocks until the image is here; PullStalled or PullError otherwise.
    `on_event` gets each decoded event (as decoded: a line that is not
    a JSON object is handed on too, for the reader to skip); `progress_mark` (read after each)
    changes whenever the pull moved."""
    try:
        endpoint = parse_docker_host(os.environ.get("DOCKER_HOST"), tls=bool(os.environ.get("DOCKER_TLS_VERIFY")))
    except EngineError as exc:
        raise PullError(f"Docker Engine unreachable: {exc}") from exc
    repository, tag = repository_and_tag(reference)
    query = urllib.parse.urlencode({"fromImage": repository, "tag": tag} if tag else {"fromImage": repository})
    connection = _connection(endpoint, stall_seconds)
    try:
        connection.request("POST", f"/images/create?{query}", headers={"X-Registry-Auth": NO_CREDENTIAL})
        response = connection.getresponse()
        if response.status >= 400:
            raise PullError(error_message(response.read(16 * 1024)) or f"HTTP {response.status} {response.reason}")
        mark, moved = progress_mark(), time.monotonic()
        while line := response.readline(EVENT_LINE_LIMIT):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            on_event(event)
            if isinstance(event, dict) and event.get("error"):
                raise PullError(str(event["error"]))
            now, new_mark = time.monotonic(), progress_mark()
            if new_mark != mark:
                mark, moved = new_mark, now
            elif now - moved > stall_seconds:
                raise PullStalled(f"no byte for {stall_seconds:g} s")
    except TimeoutError:
        raise PullStalled(f"no byte for {stall_seconds:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise PullError(f"Docker Engine unreachable: {type(exc).__name__}: {exc}") from None
    finally:
        connection.close()  # the engine cancels a pull whose client went

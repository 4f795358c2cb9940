"""One image pulled through the engine's API, its events streamed (the
adapter for core/images/pulls.py).

`docker pull`'s own endpoint, `POST /images/create`, with an empty
credential header: a renter's pull never uses registry credentials the host
keeps (docker-py would otherwise send those of ~/.docker/config.json, as
Compose would without the agent's own DOCKER_CONFIG). docker-py's `pull`
reads its stream without a timeout, so the request is made here with a read
timeout of the stall bound: an engine that sends nothing for that long (its
registry sends no byte) ends the request, and closing it cancels the
engine's pull, so nothing half-fetched stays registered and a retry starts
afresh. Events that come without a byte moving (a layer `Waiting`, a
`Retrying in 5 seconds`) do not reset the bound: `progress_mark` says what
counts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import docker
import docker.auth
import docker.errors
import docker.utils
import requests.exceptions
import urllib3.exceptions


class PullStalled(RuntimeError):
    """No byte moved for the stall bound."""


class PullError(RuntimeError):
    """The engine refused the pull or the registry failed it; the message is the engine's."""


def pull_image(
    reference: str,
    on_event: Callable[[dict], object],
    progress_mark: Callable[[], object],
    stall_seconds: float,
) -> None:
    """Blocks until the image is here; PullStalled or PullError otherwise.
    `on_event` gets each decoded event; `progress_mark` (read after each)
    changes whenever the pull moved."""
    try:
        api = docker.APIClient(timeout=stall_seconds, **docker.utils.kwargs_from_env())
    except docker.errors.DockerException as exc:
        raise PullError(f"Docker Engine unreachable: {exc}") from exc
    repository, tag = docker.utils.parse_repository_tag(reference)
    params = {"fromImage": repository, "tag": tag or "latest"}
    headers = {"X-Registry-Auth": docker.auth.encode_header({})}  # no credential of the host's
    try:
        response = api._post(  # noqa: SLF001 - docker-py's pull has no read timeout to give
            api._url("/images/create"), params=params, headers=headers, stream=True, timeout=(10, stall_seconds)
        )
        api._raise_for_status(response)  # noqa: SLF001
        mark, moved = progress_mark(), time.monotonic()
        try:
            for line in response.iter_lines(chunk_size=65536):
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
        finally:
            response.close()  # the engine cancels a pull whose client went
    except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        if isinstance(exc, (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)) or (
            "timed out" in str(exc).lower()
        ):
            raise PullStalled(f"no byte for {stall_seconds:g} s") from None
        raise PullError(f"Docker Engine unreachable: {exc}") from None
    except docker.errors.APIError as exc:
        raise PullError(str(exc.explanation or exc)) from None
    except docker.errors.DockerException as exc:
        raise PullError(str(exc)) from None
    finally:
        api.close()

"""The one adapter that owns docker-py.

docker-py is blocking; every call runs in a worker thread so the event loop keeps
serving the marketplace, and every docker-py error leaves this module as
EngineError so the rest of the agent never imports docker's exception types.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import docker
import docker.errors
import docker.types
import requests.exceptions

from gpuhost_agent.protocol import wire, wire_time


class EngineError(RuntimeError):
    """The Docker Engine refused or did not answer."""


class DockerEngine:
    """Every call is bounded twice: docker-py's socket timeout, and an asyncio
    deadline a little later in case the engine accepts the connection and
    then never answers (the worker thread is abandoned, not waited for). The
    calls share a small pool of their own, so a hung engine cannot starve the
    default executor the rest of the agent uses."""

    def __init__(self, *, timeout: float = 30):
        self._timeout = timeout
        self._client: docker.DockerClient | None = None
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="docker")
        self._streams: set = set()  # clients of long streams, closed with the engine
        self._closed = False

    def _api(self) -> docker.APIClient:
        if self._client is None:
            try:
                self._client = docker.DockerClient.from_env(timeout=int(self._timeout))
            except docker.errors.DockerException as exc:
                where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
                raise EngineError(f"Docker Engine unreachable at {where} (is dockerd running?): {exc}") from exc
        return self._client.api

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def run() -> Any:
            try:
                return fn(self._api(), *args, **kwargs)
            except docker.errors.DockerException as exc:
                raise EngineError(str(exc)) from exc
            except requests.exceptions.RequestException as exc:
                raise EngineError(f"Docker Engine unreachable: {exc}") from exc

        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._pool, run), self._timeout + 5)
        except asyncio.TimeoutError:
            raise EngineError(f"Docker Engine did not answer within {self._timeout + 5:.0f}s") from None

    def follow_daemon_events(self, on_break: Callable[[], object]) -> None:
        """Block on the engine's event stream (daemon events only: rare) until
        it breaks, then call on_break. The stream ends when dockerd stops, so
        a restart is seen even when it is quicker than a ping period. Runs in
        a thread of its own, with a client without timeout (an idle stream is
        not a hung one)."""
        try:
            client = docker.APIClient(timeout=None, **docker.utils.kwargs_from_env())
        except (EngineError, docker.errors.DockerException):
            return
        self._streams.add(client)
        try:
            for _event in client.events(filters={"type": "daemon"}, decode=True):
                pass
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError, ValueError):
            pass
        finally:
            self._streams.discard(client)
            client.close()
        if not self._closed:
            try:
                on_break()
            except RuntimeError:  # the event loop is gone: the agent is stopping
                pass

    async def ping(self) -> None:
        """EngineError unless the engine answers now."""
        await self._call(lambda api: api.ping())

    async def stack_containers(self, stack_id: str) -> list[dict]:
        """Docker's list entries for every container (running or not) of the stack."""
        return await self._call(
            lambda api: api.containers(all=True, filters={"label": [f"{wire.LABEL_STACK}={stack_id}"]})
        )

    async def environment_containers(self, env_id: str) -> list[dict]:
        """Containers this environment's agent owns: another agent on the same
        engine (another environment) owns its own."""
        return await self._call(
            lambda api: api.containers(
                all=True, filters={"label": [f"{wire.LABEL_MANAGED}=true", f"{wire.LABEL_ENV}={env_id}"]}
            )
        )

    async def swarm_list(self, kind: str, labels: str | list[str] | None = None) -> list[dict]:
        """The manager's view of a Swarm: its `nodes`, or the `services`,
        `tasks` or `networks` that carry every one of `labels`."""
        if kind not in ("nodes", "services", "tasks", "networks"):
            raise ValueError(f"not a Swarm object: {kind}")
        filters = {"label": labels} if labels else None
        return await self._call(lambda api: getattr(api, kind)(filters=filters))

    async def rental_containers(self, rental_id: str) -> list[dict]:
        return await self._call(
            lambda api: api.containers(
                all=True, filters={"label": [f"{wire.LABEL_MANAGED}=true", f"{wire.LABEL_RENTAL}={rental_id}"]}
            )
        )

    async def foreign_names(self, project: str) -> frozenset[str]:
        """Names of the engine's networks and volumes that are not the Compose
        project's own: a stack may not name one of them."""

        def names(api: docker.APIClient) -> frozenset[str]:
            volumes = api.volumes().get("Volumes") or []
            return frozenset(
                item["Name"]
                for item in [*api.networks(), *volumes]
                if (item.get("Labels") or {}).get("com.docker.compose.project") != project
            )

        return await self._call(names)

    async def finished_at(self, container_id: str) -> datetime | None:
        """When the container last stopped; None if it is running or never ran."""
        state = (await self._call(lambda api: api.inspect_container(container_id))).get("State", {})
        text = state.get("FinishedAt") or ""
        if state.get("Running") or not text or text.startswith("0001-"):
            return None
        # Docker gives nanoseconds; Python's parser takes exactly six digits at most.
        return wire_time.parse_iso(re.sub(r"\.(\d+)", lambda m: "." + (m.group(1) + "000000")[:6], text))

    async def image_labels(self, image_id: str) -> dict | None:
        """An image's own labels (what its containers inherit); None if the engine cannot say."""
        try:
            attrs = await self._call(lambda api: api.inspect_image(image_id))
        except EngineError:
            return None
        return dict((attrs.get("Config") or {}).get("Labels") or {})

    async def image_id(self, reference: str) -> str | None:
        """The id of the local image `reference` names, in any spelling the
        engine accepts (`busybox`, `docker.io/library/busybox:latest`, a
        digest); None when there is none or the engine cannot say."""
        try:
            attrs = await self._call(lambda api: api.inspect_image(reference))
        except EngineError:
            return None
        return str(attrs.get("Id") or "") or None

    async def log_tail(self, container_id: str, lines: int = 5) -> str:
        raw = await self._call(lambda api: api.logs(container_id, stdout=True, stderr=True, tail=lines))
        return raw.decode(errors="replace").strip()

    async def missing_images(self, references: list[str]) -> list[str]:
        """The references no local image answers to (what a failed pull left absent)."""

        def absent(api: docker.APIClient) -> list[str]:
            missing = []
            for reference in references:
                try:
                    api.inspect_image(reference)
                except docker.errors.ImageNotFound:
                    missing.append(reference)
            return missing

        return await self._call(absent)

    async def image_inventory(self) -> tuple[dict[str, tuple[str, int]], set[str]]:
        """({reference: (image id, unpacked size)} of every image, by each of
        its tags and by its id (an image pulled by digest has no tag), the
        ids of images any container uses, running or stopped), read in that
        order: an image a container started from in between counts as used."""

        def read(api: docker.APIClient) -> tuple[dict[str, tuple[str, int]], set[str]]:
            images = {
                reference: (str(image.get("Id")), int(image.get("Size") or 0))
                for image in api.images()
                for reference in [*(image.get("RepoTags") or []), str(image.get("Id"))]
            }
            used = {str(container.get("ImageID")) for container in api.containers(all=True)}
            return images, used

        return await self._call(read)

    async def remove_image(self, reference: str) -> None:
        """Untag `reference`, and remove the image when no other tag holds it;
        never forced: the engine refuses while a container uses it."""
        await self._call(lambda api: api.remove_image(reference, force=False, noprune=False))

    async def disk_usage(self) -> dict:
        """`GET /system/df`: each container's writable layer (SizeRw) and each
        volume's size, as `docker system df -v` shows them."""
        return await self._call(lambda api: api.df())

    async def stop_container(self, container_id: str, timeout: int) -> None:
        await self._call(lambda api: api.stop(container_id, timeout=timeout))

    async def remove_container(self, container_id: str) -> None:
        await self._call(lambda api: api.remove_container(container_id, force=True, v=True))

    async def info(self) -> dict:
        """`docker info` and `docker version` together: what the host probe needs."""

        def both(api: Any) -> dict:
            return {**api.info(), "Version": api.version()}

        return await self._call(both)

    async def gpu_container_check(self, image: str) -> str | None:
        """Start a container from a local image with every GPU requested, as a
        renter's `--gpus all` would. None when it ran and exited 0, else why not.
        The image must already be on the host: this check never pulls."""

        def run(api: Any) -> str | None:
            api.inspect_image(image)
            container = api.create_container(
                image,
                entrypoint=["true"],
                command=[],
                labels={wire.LABEL_MANAGED: "check"},
                host_config=api.create_host_config(
                    device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
                ),
            )
            try:
                api.start(container["Id"])
                code = api.wait(container["Id"], timeout=60).get("StatusCode")
                return None if code == 0 else f"GPU check container exited with status {code}"
            finally:
                api.remove_container(container["Id"], force=True)

        try:
            return await self._call(run)
        except EngineError as exc:
            return str(exc)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._closed = True
        for client in list(self._streams):
            client.close()  # ends a blocked stream read: its thread finishes

    async def container_state(self, container_id: str) -> dict:
        """The `State` object of Docker's inspect (ExitCode, OOMKilled, FinishedAt...)."""
        return (await self._call(lambda api: api.inspect_container(container_id))).get("State") or {}

    def watch_container_events(
        self, env_id: str, on_event: Callable[[dict], object], on_break: Callable[[], object]
    ) -> Any:
        """Follow the engine's container events for this environment's
        containers on a daemon thread of its own (docker-py blocks): on_event
        for each event, on_break once when the stream ends by itself (the
        engine stopped or restarted: the caller opens it again). Both are
        called from that thread. Returns a function that ends the follow
        without on_break; closing the engine ends it too."""
        stop = threading.Event()
        opened: list = []

        def end() -> None:
            stop.set()
            for stream in list(opened):
                try:
                    stream.close()  # ends the blocked read
                except Exception:  # noqa: BLE001 - already closed by the other side
                    pass

        class Follow:  # what the engine closes when it is closed itself
            close = staticmethod(end)

        closer = Follow()

        def follow() -> None:
            try:
                client = docker.APIClient(timeout=None, **docker.utils.kwargs_from_env())
            except docker.errors.DockerException:
                client = None
            if client is not None:
                self._streams.add(closer)  # closed with the engine
                try:
                    if not (stop.is_set() or self._closed):
                        opened.append(
                            client.events(
                                decode=True, filters={"type": "container", "label": [f"{wire.LABEL_ENV}={env_id}"]}
                            )
                        )
                        if stop.is_set():
                            end()
                        for event in opened[0]:
                            if stop.is_set():
                                break
                            on_event(event)
                except Exception:  # noqa: BLE001 - any end of the stream is a break, never a dead thread
                    pass
                finally:
                    self._streams.discard(closer)
                    client.close()
            if not (stop.is_set() or self._closed):
                try:
                    on_break()
                except RuntimeError:  # the event loop is gone: the agent is stopping
                    pass

        threading.Thread(target=follow, daemon=True, name="docker-container-events").start()
        return end

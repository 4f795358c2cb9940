"""The Docker Engine's short calls: lists, inspects, stops, images, the
host probe's facts, and the two event streams the agent follows.

Each is one request of the Engine API through the agent's HTTP client of the
engine (runtime/engine/calls.py), bounded by the engine's timeout; every
failure leaves this module as EngineError, so the rest of the agent never
sees an HTTP client's exception types. Ids, names and image references reach
a URL's path only once checked (checked_id, checked_reference): a renter's
image reference cannot name another endpoint.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.parse
from collections.abc import Callable
from datetime import datetime
from typing import Literal, cast, overload

import aiohttp

from gpuhost_agent.protocol import wire, wire_time
from gpuhost_agent.runtime.engine.calls import EngineCalls, checked_id, filters_param
from gpuhost_agent.runtime.engine.errors import ContainerGone, EngineError
from gpuhost_agent.runtime.engine.records import (
    ContainerConfig,
    ContainerState,
    ContainerSummary,
    DiskUsage,
    EngineEvent,
    NodeSummary,
)

__all__ = ["DockerEngine", "EngineError", "checked_id", "checked_reference"]

# An image reference as Docker spells one (name[:tag][@digest], a registry
# with its port first); '.' and '..' never make a path segment of it.
_REFERENCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,511}$")
EVENT_LINE_LIMIT = 1024 * 1024  # an event with a renter's labels in it; a longer line is skipped (read_events)
GPU_CHECK_SECONDS = 60


def checked_reference(value: str) -> str:
    """`value` quoted for a path (`@` escaped, '/' and ':' kept, as the
    docker CLI sends them), or EngineError when it is no image reference."""
    if (
        not isinstance(value, str)
        or not _REFERENCE.fullmatch(value)
        or any(part in ("", ".", "..") for part in value.split("/"))
    ):
        raise EngineError(f"not an image reference: {value!r}"[:200])
    return urllib.parse.quote(value, safe="/:")


def demultiplexed(raw: bytes) -> bytes:
    """The payloads of Docker's multiplexed frames (a container without a
    TTY: an 8-byte header, stream and length, before each), joined; bytes
    that are not frames are returned as they came (a TTY's)."""
    out, at = [], 0
    while at + 8 <= len(raw) and raw[at] in (0, 1, 2) and raw[at + 1 : at + 4] == b"\0\0\0":
        length = int.from_bytes(raw[at + 4 : at + 8], "big")
        if at + 8 + length > len(raw):
            return raw  # not whole frames
        out.append(raw[at + 8 : at + 8 + length])
        at += 8 + length
    return b"".join(out) if at >= len(raw) and out else raw


async def read_events(content: aiohttp.StreamReader, on_event: Callable[[EngineEvent], object]) -> None:
    """Each event line to `on_event` until the stream ends. A line over the
    limit is skipped, never the end of the stream: every event carries its
    container's labels, which a renter writes, so one renter's huge labels
    must not stop the events of every other (a healthchecked container's
    probes land in its events). What a
    skipped line said, the periodic resync reads from the engine's lists."""
    partial, skipping = b"", False
    while chunk := await content.readany():
        *lines, rest = (partial + chunk).split(b"\n")
        for line in lines:
            if skipping or len(line) > EVENT_LINE_LIMIT:  # (the end of) an overlong line
                skipping = False
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                on_event(cast(EngineEvent, event))
        partial = rest
        if len(partial) > EVENT_LINE_LIMIT:
            partial, skipping = b"", True


class DockerEngine(EngineCalls):
    """The engine's short calls, each bounded by `timeout` seconds."""

    def __init__(self, *, timeout: float = 30):
        super().__init__(timeout=timeout)
        self._closed = False

    async def _follow(self, kinds: dict[str, list[str]], on_event: Callable[[EngineEvent], object]) -> bool:
        """Read `GET /events` with these filters until it ends: True when it
        broke by itself (the engine stopped or restarted), False when the
        engine was closed. No overall timeout: an idle stream is not a hung one."""
        try:
            async with self._session().get(
                "/events",
                params=filters_param(**kinds),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeout),
            ) as response:
                if response.status >= 400:
                    return not self._closed
                await read_events(response.content, on_event)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - any end of the stream is a break, never a dead task
            pass
        return not self._closed

    async def follow_daemon_events(self) -> bool:
        """Wait on the engine's daemon events (rare) until the stream ends:
        True when it broke by itself, so a restart is seen even when it is
        quicker than a ping period; False once the engine is closed."""
        return await self._follow({"type": ["daemon"]}, lambda _event: None)

    def watch_container_events(
        self, env_id: str, on_event: Callable[[EngineEvent], object], on_break: Callable[[], object]
    ) -> Callable[[], None]:
        """Follow the engine's container events for this environment's
        containers in a task of the running loop: on_event for each event,
        on_break once when the stream ends by itself (the engine stopped or
        restarted: the caller opens it again). Returns a function that ends
        the follow without on_break; closing the engine ends it too."""

        async def follow() -> None:
            kinds = {"type": ["container"], "label": [f"{wire.LABEL_ENV}={env_id}"], "event": [*wire.CONTAINER_EVENTS]}
            if await self._follow(kinds, on_event):
                on_break()

        task = asyncio.get_running_loop().create_task(follow(), name="docker-container-events")

        def end() -> None:
            task.cancel()

        return end

    async def ping(self) -> None:
        """EngineError unless the engine answers now."""
        await self._call_raw("GET", "/_ping")

    async def stack_containers(self, stack_id: str) -> list[ContainerSummary]:
        """Docker's list entries for every container (running or not) of the stack."""
        return await self._containers_here([f"{wire.LABEL_STACK}={stack_id}"])

    async def environment_containers(self, env_id: str) -> list[ContainerSummary]:
        """Containers this environment's agent owns: another agent on the same
        engine (another environment) owns its own."""
        return await self._containers_here([f"{wire.LABEL_MANAGED}=true", f"{wire.LABEL_ENV}={env_id}"])

    @overload
    async def swarm_list(self, kind: Literal["nodes"], labels: str | list[str] | None = None) -> list[NodeSummary]: ...

    @overload
    async def swarm_list(
        self, kind: Literal["services", "tasks", "networks"], labels: str | list[str] | None = None
    ) -> list[dict]: ...

    async def swarm_list(self, kind: str, labels: str | list[str] | None = None) -> list[dict] | list[NodeSummary]:
        """The manager's view of a Swarm: its `nodes`, or the `services`,
        `tasks` or `networks` that carry every one of `labels`."""
        if kind not in ("nodes", "services", "tasks", "networks"):
            raise ValueError(f"not a Swarm object: {kind}")
        reply = await self._call("GET", f"/{kind}", params=filters_param(label=labels))
        return [item for item in reply if isinstance(item, dict)] if isinstance(reply, list) else []

    async def managed_networks(self) -> list[dict]:
        """This engine's networks that carry the agent's label."""
        reply = await self._call("GET", "/networks", params=filters_param(label=f"{wire.LABEL_MANAGED}=true"))
        return [item for item in reply if isinstance(item, dict)] if isinstance(reply, list) else []

    async def rental_containers(self, rental_id: str) -> list[ContainerSummary]:
        return await self._containers_here([f"{wire.LABEL_MANAGED}=true", f"{wire.LABEL_RENTAL}={rental_id}"])

    async def foreign_names(self, project: str) -> frozenset[str]:
        """Names of the engine's networks and volumes that are not the Compose
        project's own: a stack may not name one of them."""
        volumes = ((await self._call("GET", "/volumes")) or {}).get("Volumes") or []
        networks = (await self._call("GET", "/networks")) or []
        return frozenset(
            str(item.get("Name"))
            for item in [*networks, *volumes]
            if isinstance(item, dict) and (item.get("Labels") or {}).get("com.docker.compose.project") != project
        )

    async def finished_at(self, container_id: str) -> datetime | None:
        """When the container last stopped; None if it is running or never ran."""
        state = (await self._inspect_here(container_id)).get("State") or {}
        text = state.get("FinishedAt") or ""
        if state.get("Running") or not text or text.startswith("0001-"):
            return None
        # Docker gives nanoseconds; Python's parser takes exactly six digits at most.
        return wire_time.parse_iso(re.sub(r"\.(\d+)", lambda m: "." + (m.group(1) + "000000")[:6], text))

    async def _inspect_image(self, reference: str, max_bytes: int | None = None) -> dict:
        reply = await self._call("GET", f"/images/{checked_reference(reference)}/json", max_bytes=max_bytes)
        return reply if isinstance(reply, dict) else {}

    async def image_labels(self, image_id: str) -> dict | None:
        """An image's own labels (what its containers inherit); None if the engine cannot say."""
        try:
            attrs = await self._inspect_image(image_id)
        except EngineError:
            return None
        return dict((attrs.get("Config") or {}).get("Labels") or {})

    async def image_id(self, reference: str) -> str | None:
        """The id of the local image `reference` names, in any spelling the
        engine accepts (`busybox`, `docker.io/library/busybox:latest`, a
        digest); None when there is none or the engine cannot say."""
        try:
            attrs = await self._inspect_image(reference)
        except EngineError:
            return None
        return str(attrs.get("Id") or "") or None

    async def log_tail(self, container_id: str, lines: int = 5) -> str:
        raw, _ = await self._call_raw(
            "GET",
            f"/containers/{checked_id(container_id)}/logs",
            params={"stdout": "1", "stderr": "1", "tail": str(lines)},
        )
        return demultiplexed(raw).decode(errors="replace").strip()

    async def missing_images(self, references: list[str]) -> list[str]:
        """The references no local image answers to (what a failed pull left absent)."""
        missing = []
        for reference in references:
            try:
                await self._inspect_image(reference)
            except ContainerGone:  # the engine's 404
                missing.append(reference)
        return missing

    async def image_inventory(self) -> tuple[dict[str, tuple[str, int]], set[str]]:
        """({reference: (image id, unpacked size)} of every image, by each of
        its tags and by its id (an image pulled by digest has no tag), the
        ids of images any container uses, running or stopped), read in that
        order: an image a container started from in between counts as used."""
        images = {
            reference: (str(image.get("Id")), int(image.get("Size") or 0))
            for image in (await self._call("GET", "/images/json")) or []
            if isinstance(image, dict)
            for reference in [*(image.get("RepoTags") or []), str(image.get("Id"))]
        }
        used = {str(container.get("ImageID")) for container in await self._containers_here([])}
        return images, used

    async def remove_image(self, reference: str) -> None:
        """Untag `reference`, and remove the image when no other tag holds it;
        never forced: the engine refuses while a container uses it."""
        await self._call("DELETE", f"/images/{checked_reference(reference)}", params={"force": "0", "noprune": "0"})

    async def disk_usage(self) -> DiskUsage:
        """`GET /system/df`: each container's writable layer (SizeRw) and each
        volume's size, as `docker system df -v` shows them."""
        return cast(DiskUsage, (await self._call("GET", "/system/df")) or {})

    async def stop_container(self, container_id: str, timeout: int) -> None:
        path = f"/containers/{checked_id(container_id)}/stop"
        await self._call("POST", path, params={"t": str(timeout)}, timeout=self._timeout + timeout)

    async def remove_container(self, container_id: str) -> None:
        await self._call("DELETE", f"/containers/{checked_id(container_id)}", params={"force": "1", "v": "1"})

    async def info(self) -> dict:
        """`docker info` and `docker version` together: what the host probe needs."""
        info, version = await self._call("GET", "/info"), await self._call("GET", "/version")
        return {**(info or {}), "Version": version or {}}

    async def gpu_container_check(self, image: str) -> str | None:
        """Start a container from a local image with every GPU requested, as a
        renter's `--gpus all` would. None when it ran and exited 0, else why not.
        The image must already be on the host: this check never pulls."""
        try:
            await self._inspect_image(image)
            every_gpu = {"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}
            body = {
                "Image": image,
                "Entrypoint": ["true"],
                "Cmd": [],
                "Labels": {wire.LABEL_MANAGED: "check"},
                "HostConfig": {"DeviceRequests": [every_gpu]},
            }
            created = await self._call("POST", "/containers/create", body=body)
            container_id = checked_id(str((created or {}).get("Id") or ""))
            try:
                await self._call("POST", f"/containers/{container_id}/start")
                waited = await self._call("POST", f"/containers/{container_id}/wait", timeout=GPU_CHECK_SECONDS)
                code = (waited or {}).get("StatusCode")
                return None if code == 0 else f"GPU check container exited with status {code}"
            finally:
                await self._call("DELETE", f"/containers/{container_id}", params={"force": "1"})
        except EngineError as exc:
            return str(exc)

    async def close(self) -> None:
        self._closed = True
        await super().close()

    async def container_config(self, container_id: str, max_bytes: int) -> ContainerConfig:
        """`Config` of Docker's inspect (the file's merged over the image's);
        AnswerTooLarge when the inspect is over `max_bytes`."""
        return cast(ContainerConfig, (await self._inspect_here(container_id, max_bytes)).get("Config") or {})

    async def image_config(self, reference: str, max_bytes: int) -> ContainerConfig | None:
        """`Config` of a local image (what its containers start from); None
        when there is no such image; AnswerTooLarge over `max_bytes`."""
        try:
            return cast(ContainerConfig, (await self._inspect_image(reference, max_bytes)).get("Config") or {})
        except ContainerGone:  # the engine's 404
            return None

    async def container_state(self, container_id: str) -> ContainerState:
        """The `State` object of Docker's inspect (ExitCode, OOMKilled, FinishedAt...)."""
        return cast(ContainerState, (await self._inspect_here(container_id)).get("State") or {})

"""The one adapter that owns docker-py.

docker-py is blocking; every call runs in a worker thread so the event loop keeps
serving the marketplace, and every docker-py error leaves this module as
EngineError so the rest of the agent never imports docker's exception types.
"""

from __future__ import annotations

import asyncio
from typing import Any

import docker
import docker.errors
import requests.exceptions

from .. import wire


class EngineError(RuntimeError):
    """The Docker Engine refused or did not answer."""


class DockerEngine:
    def __init__(self, *, timeout: float = 30):
        self._timeout = timeout
        self._client: docker.DockerClient | None = None

    def _api(self) -> docker.APIClient:
        if self._client is None:
            self._client = docker.DockerClient.from_env(timeout=int(self._timeout))
        return self._client.api

    async def _call(self, fn, *args, **kwargs) -> Any:
        def run():
            try:
                return fn(self._api(), *args, **kwargs)
            except docker.errors.DockerException as exc:
                raise EngineError(str(exc)) from exc
            except requests.exceptions.RequestException as exc:
                raise EngineError(f"Docker Engine unreachable: {exc}") from exc

        return await asyncio.to_thread(run)

    async def stack_containers(self, stack_id: str) -> list[dict]:
        """Docker's list entries for every container (running or not) of the stack."""
        return await self._call(
            lambda api: api.containers(all=True, filters={"label": [f"{wire.LABEL_STACK}={stack_id}"]})
        )

    async def environment_containers(self, env_id: str) -> list[dict]:
        """Containers this environment's agent owns: another agent on the same
        engine (another environment) owns its own."""
        return await self._call(lambda api: api.containers(
            all=True, filters={"label": [f"{wire.LABEL_MANAGED}=true", f"{wire.LABEL_ENV}={env_id}"]}))

    async def exit_code(self, container_id: str) -> int | None:
        state = (await self._call(lambda api: api.inspect_container(container_id))).get("State", {})
        return state.get("ExitCode") if not state.get("Running") else None

    async def oom_killed(self, container_id: str) -> bool:
        state = (await self._call(lambda api: api.inspect_container(container_id))).get("State", {})
        return bool(state.get("OOMKilled"))

    async def log_tail(self, container_id: str, lines: int = 5) -> str:
        raw = await self._call(lambda api: api.logs(container_id, stdout=True, stderr=True, tail=lines))
        return raw.decode(errors="replace").strip()

    async def remove_container(self, container_id: str) -> None:
        await self._call(lambda api: api.remove_container(container_id, force=True, v=True))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

"""Fixtures: a real local marketplace and a real agent, talking HTTP on loopback,
deploying on the real Docker Engine that `make test` started.

Images come from the local build (gpuhost-test/busybox:1) and the registry on
127.0.0.1:5000; nothing is pulled from outside this machine.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from pathlib import Path

import aiohttp
import docker
import docker.errors
import pytest

from gpuhost_agent.common import logs
from gpuhost_agent.protocol import wire
from gpuhost_agent.service.config import AgentConfig
from gpuhost_agent.service.daemon import stop_agent
from gpuhost_agent.service.wiring import build_agent, start_local_marketplace
from gpuhost_agent.local_marketplace import server
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store

TEST_IMAGE = "gpuhost-test/busybox:1"
REGISTRY_IMAGE = "127.0.0.1:5000/gpuhost-test/busybox:1"
# The smallest valid Create-stack template, for tests of the HTTP surface alone.
TEMPLATE = {"name": "n", "description": "d", "content": "services: {}\n", "environmentVariables": {}}
# One long-running service that stops at once on SIGTERM-less removal.
SLEEPER = f"services:\n  app:\n    image: {TEST_IMAGE}\n    command: ['sleep', '3600']\n    stop_grace_period: 1s\n"

logs.configure(os.environ.get("GPUHOST_TEST_LOG_LEVEL", "warning"), json_lines=True)


@pytest.fixture(scope="session")
def docker_client():
    """The real engine. Not answering is a failure, not a skip: `make test` starts it."""
    client = docker.from_env()
    try:
        client.ping()
    except Exception as exc:  # pragma: no cover - a set-up problem, reported plainly
        pytest.fail(f"no Docker Engine answers ({exc}); run the tests with `make test`, which starts one")
    client.images.get(TEST_IMAGE)
    yield client
    client.close()


def make_config(state_dir: Path, **overrides) -> AgentConfig:
    values = dict(marketplace_url=None, env_id=None, api_key=None, state_dir=state_dir,
                  local_listen=("127.0.0.1", 0), local_api_key="renter-test-key", log_level="warning",
                  compose_command=None, settle_seconds=1.0, stop_timeout=1, speed_max_bytes=500_000,
                  speed_max_seconds=1.0)
    values.update(overrides)
    return AgentConfig(**values)


class Renter:
    """A renter using the marketplace's public API over HTTP."""

    def __init__(self, http: aiohttp.ClientSession, base_url: str, store):
        self.http = http
        self.base_url = base_url
        self.store = store

    async def call(self, method: str, path: str, body=None, *, key: str | None = None, raw: bytes | None = None):
        headers = {wire.API_KEY_HEADER: self.store.renterApiKey if key is None else key}
        kwargs = {"data": raw, "headers": {**headers, "Content-Type": "application/json"}} if raw is not None \
            else {"json": body, "headers": headers}
        async with self.http.request(method, self.base_url + path, **kwargs) as response:
            return response.status, await response.json(content_type=None)

    async def rental(self, gpu_count: int = 0) -> str:
        status, body = await self.call("POST", "/rentals", {"envId": self.store.envId, "name": "test", "gpuCount": gpu_count})
        assert status == 201, body
        return body["rentalId"]

    async def stack(self, rental_id: str, content: str, variables: dict | None = None, name: str = "test stack") -> str:
        template = {"name": name, "description": "test", "content": content, "environmentVariables": variables or {}}
        status, body = await self.call("POST", f"/rentals/{rental_id}/stacks", {"template": template})
        assert status == 201, body
        return body

    async def deployed(self, content: str = SLEEPER):
        """A new rental with one stack, APPLIED and its deploy job completed: (rental id, stack id, job)."""
        rental_id = await self.rental()
        stack_id = await self.stack(rental_id, content)
        stack = await self.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR))
        assert stack["status"] == wire.APPLIED, stack["errorMsg"]
        job = next(j for j in self.store.jobs.values() if j.stackId == stack_id)
        await until(lambda: job.state == "completed")
        return rental_id, stack_id, job

    async def stacks(self, rental_id: str) -> list[dict]:
        status, body = await self.call("GET", f"/rentals/{rental_id}/stacks")
        assert status == 200, body
        return body

    async def containers(self, rental_id: str, stack_id: str) -> list[dict]:
        status, body = await self.call("GET", f"/rentals/{rental_id}/stacks/{stack_id}/containers")
        assert status == 200, body
        return body

    async def wait_stack(self, rental_id: str, stack_id: str, statuses: tuple[str, ...], timeout: float = 30) -> dict | None:
        """The stack once its status is one of `statuses` (None: once it is gone)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last = None
        while loop.time() < deadline:
            last = next((s for s in await self.stacks(rental_id) if s["stackId"] == stack_id), None)
            if last is None and not statuses:
                return None
            if last is not None and last["status"] in statuses:
                return last
            await asyncio.sleep(0.05)
        raise AssertionError(f"stack {stack_id} did not reach {statuses or 'gone'} in {timeout}s; last seen: {last}")


@pytest.fixture
async def market(tmp_path):
    """The marketplace alone (no agent): these tests are about its HTTP surface."""
    store = Store.load_or_create(tmp_path / "m.json", "renter-key")
    running = await server.start(MarketplaceState(store), "127.0.0.1", 0)
    async with aiohttp.ClientSession() as http:
        yield Renter(http, running.base_url, store)
    await running.stop()


@pytest.fixture
async def local_market(tmp_path, docker_client):
    """Local marketplace + agent in this event loop; yields (renter, parts, running marketplace)."""
    config = make_config(tmp_path / "state")
    local = await start_local_marketplace(config)
    parts = build_agent(config, local.base_url, local.state.store.envApiKey)
    agent_task = asyncio.create_task(parts.agent.run())
    await asyncio.wait_for(parts.session.connected.wait(), 10)
    http = aiohttp.ClientSession()
    try:
        yield Renter(http, local.base_url, local.state.store), parts, local
    finally:
        await http.close()
        await stop_agent(parts, agent_task)
        await local.stop()
        remove_env_resources(docker_client, local.state.store.envId)


def remove_env_resources(client, env_id: str, attempts: int = 5) -> None:
    """Whatever a test left behind in the engine, found by the agent's own label.
    The prune is retried while another prune runs on the same engine (409)."""
    for container in client.containers.list(all=True, filters={"label": f"{wire.LABEL_ENV}={env_id}"}):
        container.remove(force=True, v=True)
    for attempt in range(attempts):
        try:
            client.networks.prune(filters={"label": "com.docker.compose.project"})
            return
        except docker.errors.APIError as exc:
            if exc.status_code != 409 or attempt == attempts - 1:
                raise
            time.sleep(0.5)


def env_containers(client, env_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{wire.LABEL_ENV}={env_id}"})


async def until(predicate, timeout: float = 10) -> None:
    """Wait for a condition on in-process state (the store, the dispatcher), or
    for an async predicate (a question asked over HTTP)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        answer = predicate()
        if inspect.isawaitable(answer):
            answer = await answer
        if answer:
            return
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def gpu_agent(tmp_path, monkeypatch, docker_client):
    """start(heartbeat_seconds=..., gpus=N, **config overrides) -> (renter, parts, local, nvml config path):
    the local marketplace and an agent on a stand-in machine of N H100 GPUs (8 by default)."""
    from fake_nvml import build_lib, forget_loaded_nvml, h100_sxm, write_config

    nvml_config = write_config(tmp_path / "nvml.conf", h100_sxm(8))
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(nvml_config))
    running = []

    async def start(heartbeat_seconds: float = 0.5, gpus: int | None = None, **overrides):
        if gpus is not None:
            write_config(nvml_config, h100_sxm(gpus))
        config = make_config(tmp_path / "state", nvml_library=str(build_lib()), location="EU-DE-Frankfurt",
                             speed_max_bytes=2_000_000, speed_max_seconds=2.0, gpu_check_image=TEST_IMAGE,
                             **overrides)
        local = await start_local_marketplace(config)
        local.state.intervals["heartbeatSeconds"] = heartbeat_seconds
        parts = build_agent(config, local.base_url, local.state.store.envApiKey)
        task = asyncio.create_task(parts.agent.run())
        http = aiohttp.ClientSession()
        running.append((parts, task, local, http))
        return Renter(http, local.base_url, local.state.store), parts, local, nvml_config

    yield start
    for parts, task, local, http in running:
        await http.close()
        if not task.done():
            await stop_agent(parts, task)
        await local.stop()
        remove_env_resources(docker_client, local.state.store.envId)
    forget_loaded_nvml()

"""What the tests create in the real Docker Engine, and how they clean it up.

Everything is found by the labels the agent itself puts on what it creates,
so a test removes exactly what its environment left behind.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

import docker.errors

from gpuhost_agent.protocol import wire
from support.stacks import TEST_IMAGE


def env_containers(client, env_id: str, attempts: int = 5) -> list:
    """The environment's containers. docker-py inspects each one it lists, so a
    container the agent removes in between (404) means: list again."""
    for attempt in range(attempts):
        try:
            return client.containers.list(all=True, filters={"label": f"{wire.LABEL_ENV}={env_id}"})
        except docker.errors.NotFound:
            if attempt == attempts - 1:
                raise
    return []


def remove_env_resources(client, env_id: str, attempts: int = 5) -> None:
    """Whatever a test left behind in the engine, found by the agent's own label.
    The prune is retried while another prune runs on the same engine (409)."""
    projects, rentals = set(), set()
    for container in env_containers(client, env_id):
        projects.add(container.labels.get("com.docker.compose.project"))
        rentals.add(container.labels.get(wire.LABEL_RENTAL) or "")
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True, v=True)
    for volume in client.volumes.list(filters={"label": "com.docker.compose.project"}):
        if volume.attrs.get("Labels", {}).get("com.docker.compose.project") in projects:
            with contextlib.suppress(docker.errors.APIError):
                volume.remove(force=True)
    for attempt in range(attempts):
        try:
            client.networks.prune(filters={"label": "com.docker.compose.project"})
            break
        except docker.errors.APIError as exc:
            if exc.status_code != 409 or attempt == attempts - 1:
                raise
            time.sleep(0.5)
    remove_empty_rental_cgroups(rentals - {""})


def remove_empty_rental_cgroups(rentals: set[str]) -> None:
    """The cgroups of the test's own rentals that never ended, once empty.
    Only these: another test's agent, or the GPU-machine run beside this
    session, may have just made and limited its rental's cgroup, empty until
    Compose starts the first container in it; removed then, runc makes it
    again without the rental's limits (a CI run once failed on this)."""
    for rental in sorted(rentals):
        for folder in Path("/sys/fs/cgroup").glob(f"*/gpuhost-agent/r-{rental}"):
            with contextlib.suppress(OSError):
                folder.rmdir()


def labels(env_id: str, rental_id: str, stack_id: str) -> dict:
    return {
        wire.LABEL_MANAGED: "true",
        wire.LABEL_ENV: env_id,
        wire.LABEL_RENTAL: rental_id,
        wire.LABEL_STACK: stack_id,
    }


class Containers:
    """Containers with the agent's labels, removed at the end of the test."""

    def __init__(self, docker_client):
        self.client = docker_client
        self.env_id = "env-" + uuid.uuid4().hex[:8]
        self.rental_id = "rental-" + uuid.uuid4().hex[:8]
        self.stack_id = "stack-" + uuid.uuid4().hex[:8]
        self.made: list = []

    def run(self, script: str, *, tty: bool = False, stack_id: str | None = None, **kwargs):
        container = self.client.containers.run(
            TEST_IMAGE,
            ["sh", "-c", script],
            detach=True,
            tty=tty,
            labels=labels(self.env_id, self.rental_id, stack_id or self.stack_id),
            **kwargs,
        )
        self.made.append(container)
        return container

    def remove_all(self) -> None:
        for container in self.made:
            with contextlib.suppress(Exception):
                container.remove(force=True)

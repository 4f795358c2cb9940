"""The stack's pulled images judged before `up`, and its started containers
after (core/sandbox/image_config.py decides; this asks the engine).

Before `up`: each service's image as the engine holds it now (the agent
pulled it, or it was there); an image that is not local yet is judged on the
started container instead (Compose pulls it, `pull_policy: always`). The
engine's answers are read to 1 MiB at most: a renter's image made them.
"""

from __future__ import annotations

from gpuhost_agent.core.sandbox.image_config import (
    MAX_INSPECT_BYTES,
    service_image_problem,
    started_container_problem,
    too_large_problem,
)
from gpuhost_agent.runtime.engine import DockerEngine
from gpuhost_agent.runtime.engine_errors import AnswerTooLarge, ContainerGone


async def image_problems(engine: DockerEngine, stack: dict) -> list[str]:
    """What is wrong with the images of the (hardened) stack, one line per service."""
    problems: list[str] = []
    configs: dict[str, dict | None] = {}  # an image several services share is asked once
    for name, service in sorted((stack.get("services") or {}).items()):
        image = service.get("image") if isinstance(service, dict) else None
        if not isinstance(image, str):
            continue
        if image not in configs:
            try:
                configs[image] = await engine.image_config(image, MAX_INSPECT_BYTES)
            except AnswerTooLarge:
                problems.append(too_large_problem(f'service "{name}" (image {image[:200]!r})'))
                configs[image] = None
                continue
        config = configs[image]
        if config is not None and (problem := service_image_problem(name, service, config)):
            problems.append(problem)
    return problems


async def started_problem(engine: DockerEngine, containers: list[dict]) -> str | None:
    """The first started container whose configuration is over the bounds."""
    for container in containers:
        name = str((container.get("Names") or [container["Id"][:12]])[0]).lstrip("/")
        try:
            config = await engine.container_config(container["Id"], MAX_INSPECT_BYTES)
        except ContainerGone:  # the settle check says why it went
            continue
        except AnswerTooLarge:
            return too_large_problem(f"container {name}")
        if problem := started_container_problem(name, config):
            return problem
    return None

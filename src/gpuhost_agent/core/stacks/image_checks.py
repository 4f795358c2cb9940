"""The stack's pulled images judged before `up`, and its started containers
after (core/sandbox/image_config.py decides; this asks the engine).

Before `up`: each service's image as the engine holds it now. On one machine
the agent pulled every image (at each deploy for `pull_policy: always`) and
Compose pulls none (core/stacks/compose_backend.py, stack_file), so what is
judged is what starts; on a Swarm the machines pull their own, and only the
leader's local images are judged. After the start, each container once more
(a tag another deploy pulled again in between). The engine's answers are
read to 1 MiB at most: a renter's image made them.
"""

from __future__ import annotations

from gpuhost_agent.core.compose_values import ComposeModel
from gpuhost_agent.core.sandbox.image_config import (
    MAX_INSPECT_BYTES,
    service_image_problem,
    started_container_problem,
    too_large_problem,
)
from gpuhost_agent.runtime.engine.client import DockerEngine
from gpuhost_agent.runtime.engine.errors import AnswerTooLarge, ContainerGone
from gpuhost_agent.runtime.engine.records import ContainerConfig, ContainerSummary


async def image_problems(engine: DockerEngine, stack: ComposeModel, *, local: bool) -> list[str]:
    """What is wrong with the images of the (hardened) stack, one line per
    service. `local`: the agent pulled every image here (one machine), so an
    image still absent is one its pull did not bring; else (a Swarm's
    machines pull their own) an absent image is not judged here."""
    problems: list[str] = []
    configs: dict[str, ContainerConfig | None] = {}  # an image several services share is asked once
    too_large: set[str] = set()
    for name, service in sorted((stack.get("services") or {}).items()):
        image = service.get("image") if isinstance(service, dict) else None
        if not isinstance(image, str):
            continue
        if image not in configs:
            try:
                configs[image] = await engine.image_config(image, MAX_INSPECT_BYTES)
            except AnswerTooLarge:
                configs[image] = None
                too_large.add(image)
        config = configs[image]
        if image in too_large:
            problems.append(too_large_problem(f'service "{name}" (image {image[:200]!r})'))
        elif config is None and local:
            problems.append(f'service "{name}": its image {image[:200]!r} is not on this host after its pull')
        elif config is not None and (problem := service_image_problem(name, service, config)):
            problems.append(problem)
    return problems


async def started_problem(engine: DockerEngine, containers: list[ContainerSummary]) -> str | None:
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

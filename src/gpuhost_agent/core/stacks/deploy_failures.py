"""What a failed deploy tells the renter: which service, which image, and the
last lines its container printed, read before the teardown removes them.

Compose's own message is kept, but it rarely says enough: with `--progress
quiet` a pull failure is "manifest unknown" or a proxy error without the
service it was for, and a dependency that fails its healthcheck is named by
container only. The engine is asked after the failure (only then, so a
deploy that works pays nothing): which images are still absent, and which
containers stopped or are unhealthy.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping

from gpuhost_agent.core.compose_values import ComposeModel
from gpuhost_agent.core.stacks.container_list import (
    RENTAL_MEMORY_REACHED,
    exit_facts,
    failed_containers,
    service_name,
    unhealthy,
)
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.runtime.engine.records import ContainerSummary

LAST_OUTPUT = 500  # characters of a failing container's log in errorMsg
PULL_MESSAGE = 300  # characters of Compose's message on a failed pull
# The engine quotes a registry's reply it could not parse ("error parsing HTTP 404 response body: ...: "<body>"):
# whatever answered as a registry (a redirect's or a token realm's target too) is not read back to the renter.
REGISTRY_REPLY = re.compile(r"response body\b.*", re.DOTALL)


def without_registry_reply(message: str) -> str:
    return REGISTRY_REPLY.sub("response body (the registry's reply is not shown)", message, count=1)


def service_images(model: ComposeModel) -> dict[str, str]:
    """service -> image reference, from the Compose model the agent deploys."""
    services = model.get("services") or {}
    return {name: str(spec["image"]) for name, spec in sorted(services.items()) if (spec or {}).get("image")}


def pull_failure(images: Mapping[str, str], missing: list[str], compose_message: str) -> str | None:
    """ "service 'web' could not get its image 'x'" for each service whose image
    is still absent after Compose failed; None when every image is here."""
    absent = set(missing)
    named = [f"service {name!r} could not get its image {image!r}" for name, image in images.items() if image in absent]
    if not named:
        return None
    hint = "is the reference right, and the image public or in a registry this host reaches?"
    reason = compose_message if len(compose_message) <= PULL_MESSAGE else compose_message[:PULL_MESSAGE] + "..."
    return f"deploy failed: {'; '.join(named)} ({hint}): {reason}"


# Whether a rental's containers together reached its memory limit (RentalCgroups).
LimitReached = Callable[[str], bool]


def failure_reason(container: ContainerSummary, code: int | None, oom: bool, rental_limit: bool = False) -> str:
    if oom:
        killed = "was killed for running out of memory"
        return f"{killed}: {RENTAL_MEMORY_REACHED}" if rental_limit else killed
    if unhealthy(container):
        return "is running but unhealthy (its healthcheck fails)"
    return f"exited with code {code}" if code is not None else f"is {container.get('State', 'not running')}"


def with_output(message: str, tail: str) -> str:
    return f"{message}; its last output: {tail[-LAST_OUTPUT:]}" if tail else message


async def describe_container(
    engine: DockerEngine, container: ContainerSummary, when: str, rental_limit_reached: LimitReached | None = None
) -> str:
    """ "service 'web' exited with code 3 <when>; its last output: ...". An
    OOM kill says whether the rental's limit, shared by all its containers,
    was what ran out (the same words as the container list's state)."""
    container_id = str(container.get("Id", ""))
    try:
        state = await engine.container_state(container_id)
        facts = exit_facts(state)
        code, oom = (None if state.get("Running") else facts.exit_code), facts.oom_killed
        tail = await engine.log_tail(container_id, lines=5)
    except EngineError:
        code, oom, tail = None, False, ""
    rental_id = (container.get("Labels") or {}).get(wire.LABEL_RENTAL)
    at_rental_limit = bool(
        oom and rental_id and rental_limit_reached and await asyncio.to_thread(rental_limit_reached, rental_id)
    )
    reason = failure_reason(container, code, oom, at_rental_limit)
    return with_output(f"service {service_name(container)!r} {reason}{when}", tail)


async def describe_up_failure(
    engine: DockerEngine,
    stack_id: str,
    model: ComposeModel,
    compose_message: str,
    rental_limit_reached: LimitReached | None = None,
) -> str:
    """The errorMsg of a deploy whose `compose up` failed."""
    compose_message = without_registry_reply(compose_message)
    try:
        images = service_images(model)
        pulled = pull_failure(images, await engine.missing_images(sorted(set(images.values()))), compose_message)
        if pulled:
            return pulled
        raw = await engine.stack_containers(stack_id)
    except EngineError:
        return f"deploy failed: {compose_message}"
    failing = [c for c in raw if unhealthy(c)] + failed_containers(raw)
    if not failing:
        return f"deploy failed: {compose_message}"
    described = await describe_container(engine, failing[0], "", rental_limit_reached)
    return f"deploy failed: {compose_message}; {described}"

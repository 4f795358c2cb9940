"""Names the agent derives from a stack: compose project name, pStackId, labels.

All derived from ids alone, so that after an agent restart (and without any
local state) the same stack maps to the same compose project and containers.
"""

from __future__ import annotations

import hashlib
import re

from gpuhost_agent.protocol import wire

_NOT_PROJECT_CHARS = re.compile(r"[^a-z0-9_-]+")


def project_name(stack_name: str, stack_id: str) -> str:
    """Compose project name: readable for operators, unique per stack.

    Two renters may both call their stack "web"; the stack id suffix keeps them
    apart. Compose wants lowercase letters, digits, '-' and '_', starting with a
    letter or digit.
    """
    slug = _NOT_PROJECT_CHARS.sub("-", stack_name.lower()).strip("-_")[:40].strip("-_")
    suffix = _NOT_PROJECT_CHARS.sub("", stack_id.lower())[:8] or "stack"
    return f"{slug}-{suffix}" if slug else f"stack-{suffix}"


def stack_name_of(project: str, stack_id: str) -> str:
    """The inverse of project_name for a project found on Docker's labels: the
    slug stands in for a name the marketplace no longer gives, so that
    project_name(stack_name_of(p, stack_id), stack_id) finds the same project.
    The suffix is cut by the id that made it, not at the last '-': an id may
    hold one in its first 8 characters."""
    suffix = project_name("", stack_id).removeprefix("stack")  # "-<id prefix>"
    if project.endswith(suffix):
        return project[: -len(suffix)]
    return project.rsplit("-", 1)[0] if "-" in project else ""  # made some other way


def provider_stack_id(stack_id: str) -> int:
    """pStackId: a stable positive 31-bit integer for the stack.

    The seed wants an integer "provider stack identifier"; Compose projects have
    none. A hash of the stack id is stable across restarts without any state.
    """
    return int.from_bytes(hashlib.sha256(stack_id.encode()).digest()[:4], "big") & 0x7FFFFFFF or 1


def stack_labels(
    stack_id: str, rental_id: str, env_id: str, gpus: list[str] | tuple[str, ...] = (), *, ssh: bool = False
) -> dict[str, str]:
    """Docker is the record of what the agent owns. The rental's GPUs are on
    the label too, so that a lost state file can be rebuilt from the engine
    without handing a rental's GPUs to another one; so is whether the
    template allows SSH, which the agent's SSH server checks at each login.

    Every label of the agent's namespace that the agent reads is set here,
    an empty value meaning "none" or "no": a container's labels are its
    image's with these laid over them, so a label the agent left out would be
    whatever the image carries (`LABEL io.gpuhost.ssh=true` in a Dockerfile)."""
    return {
        wire.LABEL_MANAGED: "true",
        wire.LABEL_STACK: stack_id,
        wire.LABEL_RENTAL: rental_id,
        wire.LABEL_ENV: env_id,
        wire.LABEL_GPUS: ",".join(gpus),
        wire.LABEL_SSH: "true" if ssh else "",
        wire.LABEL_EXPOSED_PORTS: "",  # the Swarm rewrite writes the expose: ports (core/swarm/stack_file.py)
    }


def gpus_of(labels: dict[str, str]) -> list[str]:
    return [uuid for uuid in (labels.get(wire.LABEL_GPUS) or "").split(",") if uuid]

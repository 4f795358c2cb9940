"""Pure decisions about a renter's Compose project before it runs.

Input is Compose's own normalised model (`docker compose config --format json`),
so interpolation and YAML anchors are already resolved by the real Compose
implementation and no YAML trick survives to this point.
"""

from __future__ import annotations

import copy
import re

from gpuhost_agent.core.compose_values import ComposeModel, as_mapping
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.core.stacks.naming import stack_labels
from gpuhost_agent.protocol import wire
from gpuhost_agent.protocol.wire_values import clipped

# Compose reads its own settings (project name, files, profiles, the Docker host)
# from these variables; a renter must not steer the agent's compose run.
_RESERVED_EXACT = {
    "PATH",
    "HOME",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "DOCKER_CONTEXT",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
}
_RESERVED_PREFIXES = ("COMPOSE_", "DOCKER_", "BUILDKIT_")
# Compose settings a renter may choose: which profiles' services start.
_ALLOWED_COMPOSE = {"COMPOSE_PROFILES"}
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# Every value is registered with the log redactor, which looks for each one in
# every log line (common/logs.py): 100,000 of them cost 232 ms a line. Published templates set a few dozen.
MAX_VARIABLES = 256


def check_variables(variables: dict[str, str]) -> None:
    """Refuse template variables that are not usable names, too many, or that steer Compose."""
    if len(variables) > MAX_VARIABLES:
        raise StackRejected(f"the template sets {len(variables)} variables, at most {MAX_VARIABLES}")
    for name in variables:
        if not _VARIABLE_NAME.fullmatch(name):
            raise StackRejected(
                f"environment variable name {clipped(name, 61)!r} is invalid: use letters, digits and '_', "
                "not starting with a digit"
            )
        if name in _ALLOWED_COMPOSE:
            continue
        if name in _RESERVED_EXACT or name.startswith(_RESERVED_PREFIXES):
            raise StackRejected(f"environment variable {name!r} is reserved for the host agent; rename it")


def label_services(
    model: ComposeModel, stack_id: str, rental_id: str, env_id: str, gpus: list[str] | None = None, *, ssh: bool = False
) -> ComposeModel:
    """A copy of the model with the agent's labels on every service.

    The project name comes from the agent (`-p`), so a `name:` in the file is
    dropped rather than left to disagree with it. The `expose:` ports the
    Swarm rewrite wrote (core/swarm/stack_file.py) stay: the sandbox ran first,
    and no renter's file names a label of the agent's (core/sandbox/policy.py).
    """
    services = model.get("services")
    if not isinstance(services, dict) or not services:
        raise StackRejected("the Compose file defines no services")
    rewritten = copy.deepcopy(model)
    rewritten.pop("name", None)
    labels = stack_labels(stack_id, rental_id, env_id, gpus or (), ssh=ssh)
    for service_name, service in rewritten["services"].items():
        if not isinstance(service, dict):
            raise StackRejected(f"service {service_name!r} is not a mapping")
        own = as_mapping(service.get("labels"))
        exposed = {wire.LABEL_EXPOSED_PORTS: own[wire.LABEL_EXPOSED_PORTS]} if own.get(wire.LABEL_EXPOSED_PORTS) else {}
        service["labels"] = {**own, **labels, **exposed}
    return rewritten

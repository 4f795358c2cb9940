"""Which variables a renter's file interpolates: the template's, never the
agent's. Pure.

Compose fills `${NAME}` from its own process environment first and from the
`--env-file` (the template's variables) only after, and the agent's fixed
environment for Compose (runtime/host_process.py host_environment) holds the
agent's PATH, HOME and DOCKER_CONFIG (its own config folder) and the engine's
address. So `environment: {X: "${HOME}:${PATH}"}` used to put the agent's
paths into the container, and a template that set HOME could not have it.
Every reference in the file's values is therefore renamed here, before
Compose reads the file, to the template's spelling of the name
(runtime/compose.py TEMPLATE_PREFIX), which only the env file the agent
writes for `config` defines: no process environment has such a name, so a
variable the template does not set is empty, with Compose's "not set"
warning as a notice, whatever the agent's environment holds, now or after a
change to it. Compose's own `COMPOSE_*` names (the project's name) keep
their meaning. Keys are left alone: Compose does not interpolate them.
"""

from __future__ import annotations

import re

import yaml

from gpuhost_agent.runtime.compose import TEMPLATE_PREFIX

# As Compose's template parser reads a value: `$$` is a literal `$`, and
# `$NAME` or `${NAME...}` a reference, also inside another's default.
_REFERENCE = re.compile(r"\$(?:(\$)|(\{?)([_A-Za-z][_A-Za-z0-9]*))")


def confined(value: str) -> str:
    """`value` with each variable it names renamed to the template's spelling."""

    def renamed(match: re.Match[str]) -> str:
        escaped, brace, name = match.groups()
        if escaped or name.startswith("COMPOSE_"):
            return match.group(0)
        return f"${brace}{TEMPLATE_PREFIX}{name}"

    return _REFERENCE.sub(renamed, value) if "$" in value else value


def confine(root: yaml.Node | None) -> None:
    """Every value of the node tree renamed in place (an alias's node once)."""
    seen: set[int] = set()
    pending = [root]
    while pending:
        node = pending.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode) and isinstance(node.value, str):
            node.value = confined(node.value)
        elif isinstance(node, yaml.SequenceNode):
            pending += node.value
        elif isinstance(node, yaml.MappingNode):
            pending += [value for _key, value in node.value]

"""One machine or many is decided once, in the composition root
(docs/design.md "One machine or many"): no module outside the Swarm backend
imports a Swarm module, compares with the mode's words ("leader",
"worker") or names a Swarm class. Parsed with `ast`, so a comment or a
docstring that mentions Swarm is fine; code that asks which mode it is in
is not."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "gpuhost_agent"

# The Swarm backend, and the places that choose it or serve it.
SWARM_SIDE = (
    "runtime/swarm_",  # the engine adapters of a Swarm manager
    "core/swarm/",  # the Swarm backend, the core side
    "service/swarm_tls.py",
    "service/swarm_worker.py",  # the agent on another machine
    "service/topology.py",  # where the topology is decided
    "service/config.py",  # the settings: GPUHOST_SWARM declared, read and shown
    "service/settings.py",
    "service/settings_view.py",
    "service/daemon.py",  # which program a machine runs: the agent, or a worker's door
)

SWARM_MODULES = (
    "gpuhost_agent.runtime.swarm_",
    "gpuhost_agent.core.swarm",
    "gpuhost_agent.inventory.swarm_nodes",
    "gpuhost_agent.service.swarm_tls",
    "gpuhost_agent.service.swarm_worker",
)
MODE_WORDS = {"leader", "worker"}


def _exempt(relative: str) -> bool:
    return relative.startswith(SWARM_SIDE)


def _swarm_module(name: str) -> bool:
    return name.startswith(SWARM_MODULES)


def _is_swarm_class(name: str) -> bool:
    return name.startswith("Swarm") and len(name) > 5 and name[5].isupper()


def mode_questions(tree: ast.AST) -> list[str]:
    """What in one module's code names the Swarm mode, each with its line."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: imports {a.name}" for a in node.names if _swarm_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(_swarm_module(module) for module in modules):
                found.append(f"{node.lineno}: imports from {node.module}")
        elif isinstance(node, ast.Compare):
            words = [
                part.value
                for part in (node.left, *node.comparators)
                if isinstance(part, ast.Constant) and part.value in MODE_WORDS
            ]
            found += [f"{node.lineno}: compares with {word!r}" for word in words]
        elif isinstance(node, ast.Name) and _is_swarm_class(node.id):
            found.append(f"{node.lineno}: names {node.id}")
        elif isinstance(node, ast.Attribute) and _is_swarm_class(node.attr):
            found.append(f"{node.lineno}: names {node.attr}")
    return found


def test_no_module_outside_the_swarm_backend_asks_which_mode_it_is_in() -> None:
    offenders = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if _exempt(relative):
            continue
        found = mode_questions(ast.parse(path.read_text(), str(path)))
        if found:
            offenders[relative] = found
    listed = "\n".join(f"  {module}: {'; '.join(found)}" for module, found in offenders.items())
    assert not offenders, f"these modules ask which mode they are in (service/topology.py decides it):\n{listed}"


def test_the_check_sees_each_kind_of_question() -> None:
    """Each kind of question the test looks for is found in code that asks it."""
    code = (
        "from gpuhost_agent.core.swarm.watch import SwarmWatch\n"
        "import gpuhost_agent.runtime.swarm_stacks\n"
        "if config.swarm == 'leader': pass\n"
        "engine = module.SwarmEngine()\n"
    )
    found = mode_questions(ast.parse(code))
    assert [line.split(":")[0] for line in found] == ["1", "2", "3", "4"], found

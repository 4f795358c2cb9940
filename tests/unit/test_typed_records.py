"""Core works on typed records, not bare dicts: each kind of data is
described where it enters. The engine's JSON is named where it enters
(runtime/engine/records.py), the marketplace's and the machine facts' in
protocol/ (wire.py, wire_jobs.py, wire_replies.py, wire_system.py), the
agent's own tables and upgrade record in storage/ (agent_db.py,
upgrade_state.py); core annotates those records.

Parsed with `ast`: in core, no annotation (a parameter, a return, an
annotated name or field, a type alias) may be a bare `dict` or `Mapping`,
a `dict[..., Any]` or a `Mapping[..., Any]`, alone or inside another type
(`list[dict]`, `dict | None`, `Callable[[dict], None]`). A dict whose
values are typed (`dict[str, int]`, `dict[str, object]`) is fine: it says
what it holds.

The exceptions are the modules that work on a renter's Compose model, a
free-form YAML document that is neither the engine's data nor the
marketplace's (core/compose_values.py names it ComposeModel)."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "src" / "gpuhost_agent" / "core"

ALLOWED = (
    "sandbox/",  # the Compose model hardened: its services, volumes, networks
    "swarm/stack_file.py",  # the Compose model rewritten for `docker stack deploy`
    "compose_values.py",  # ComposeModel itself, and a Compose value as a mapping
)
MAPPINGS = {"dict", "Dict", "Mapping", "MutableMapping"}


def _is_any(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any")


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def untyped(annotation: ast.expr) -> list[str]:
    """The untyped mappings in one annotation, as written."""
    found: list[str] = []
    subscripted = set()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Subscript) and _name(node.value) in MAPPINGS:
            subscripted.add(id(node.value))
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if len(args) == 2 and _is_any(args[1]):
                found.append(ast.unparse(node))
    for node in ast.walk(annotation):
        if _name(node) in MAPPINGS and id(node) not in subscripted and isinstance(node, ast.Name | ast.Attribute):
            found.append(ast.unparse(node))
    return found


def _is_alias(node: ast.Assign) -> bool:
    """`Name = Callable[...]` and the like at module level: a type alias."""
    return (
        len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id[:1].isupper()
        and isinstance(node.value, ast.Subscript | ast.BinOp)
    )


def annotations(tree: ast.Module) -> list[tuple[int, ast.expr]]:
    out: list[tuple[int, ast.expr]] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_alias(node):
            out.append((node.lineno, node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None and arg.annotation is not None:
                    out.append((arg.lineno, arg.annotation))
            if node.returns is not None:
                out.append((node.lineno, node.returns))
        elif isinstance(node, ast.AnnAssign):
            out.append((node.lineno, node.annotation))
    return out


def offences(source: str) -> list[str]:
    return [f"{line}: {found}" for line, annotation in annotations(ast.parse(source)) for found in untyped(annotation)]


def test_core_annotates_records_not_bare_dicts() -> None:
    offenders = {}
    for path in sorted(CORE.rglob("*.py")):
        relative = path.relative_to(CORE).as_posix()
        if relative.startswith(ALLOWED):
            continue
        found = offences(path.read_text())
        if found:
            offenders[relative] = found
    listed = "\n".join(f"  core/{module}: {'; '.join(found)}" for module, found in offenders.items())
    assert not offenders, (
        "core annotates untyped mappings; name the record (runtime/engine/records.py, "
        f"protocol/wire*.py, storage/) or type the values:\n{listed}"
    )


def test_the_allowed_modules_exist() -> None:
    """An allowed module that was renamed or removed leaves the list: it stays honest."""
    for allowed in ALLOWED:
        assert (CORE / allowed).exists(), allowed


def test_the_check_sees_each_kind() -> None:
    code = (
        "from typing import Any\n"
        "Reports = Callable[[list[str]], Awaitable[dict[str, dict]]]\n"
        "def a(x: dict) -> list[dict]: ...\n"
        "def b(x: dict[str, Any] | None, y: Mapping[str, Any], z: Mapping) -> None: ...\n"
        "class C:\n"
        "    model: dict\n"
        "    def __init__(self) -> None:\n"
        "        self.seen: dict[str, int] = {}\n"
        "        self.fine: dict[str, object] = {}\n"
        "def fine(x: ContainerSummary, y: Mapping[str, str]) -> dict[str, list[str]]: ...\n"
    )
    assert offences(code) == [
        "2: dict",
        "3: dict",
        "3: dict",
        "4: dict[str, Any]",
        "4: Mapping[str, Any]",
        "4: Mapping",
        "6: dict",
    ]

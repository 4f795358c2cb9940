"""Values of a renter's Compose model that every part of core reads the same
way: a mapping written either way, and a refusal's problems said within
bounds (a file of a thousand forbidden volumes, or a name of a megabyte,
must not make an errorMsg or a log line of megabytes)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuhost_agent.protocol.wire_values import clipped

# A renter's Compose model: the file as parsed, then normalised and hardened. It
# is a free-form YAML document the renter wrote, neither the engine's nor the
# marketplace's data, so it stays a plain mapping, under this one name; its
# readers check each value they use.
ComposeModel = dict[str, Any]

MAX_PROBLEMS_SAID = 20  # a refusal names at most this many problems, then how many more
PROBLEM_CHARS = 400  # each cut here


def problems_said(problems: list[str]) -> str:
    """`problems` joined for an errorMsg, the first MAX_PROBLEMS_SAID of them."""
    shown = [clipped(problem, PROBLEM_CHARS - 3) for problem in problems[:MAX_PROBLEMS_SAID]]
    if len(problems) > len(shown):
        shown.append(f"and {len(problems) - len(shown)} more")
    return "; ".join(shown)


def as_mapping(value: dict | Iterable[object] | None, missing: str | None = "") -> dict:
    """Compose's environment and labels come as a mapping or as a list of
    "KEY=value" items; the list form becomes a mapping (a bare KEY gets
    `missing`)."""
    if isinstance(value, dict):
        return dict(value)
    pairs: list[tuple[str, str | None]] = []
    for item in value or []:
        key, sep, rest = str(item).partition("=")
        pairs.append((key, rest) if sep else (key, missing))
    return dict(pairs)

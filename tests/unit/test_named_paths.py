"""Every module a document, a docstring or a comment names by its path exists.

Modules move (core/ went into folders by subject); a reader who follows
`core/sandbox/raw.py` from docs/sandbox-policy.md must find it there, not a
file that went two commits ago."""

from __future__ import annotations

import os
import re
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = "core|runtime|streams|service|inventory|uplink|storage|protocol|common|local_marketplace"
NAMED = re.compile(rf"(?<![\w./-])((?:src/gpuhost_agent/)?(?:{LAYERS})/[\w/]+\.py)")
READ = {
    ".": ("*.md",),
    "docs": ("*.md", "*.yaml"),
    "src": ("*.py",),
    "tests": ("*.py",),
    "bench": ("*.py",),
    "scripts": ("*",),
}


def named_paths(text: str) -> set[str]:
    return {match.group(1) for match in NAMED.finditer(text)}


def _files() -> list[Path]:
    """The project's own files: hidden folders (tests/.rootfs holds a whole
    Debian) and caches are not walked into."""
    found = []
    for top, patterns in READ.items():
        for folder, dirs, files in os.walk(ROOT / top):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"] if top != "." else []
            found += [Path(folder) / name for name in files if any(fnmatch(name, p) for p in patterns)]
    return found


def test_named_paths_are_found_in_prose_and_code():
    assert named_paths("see core/sandbox/raw.py and `src/gpuhost_agent/runtime/engine/client.py`.") == {
        "core/sandbox/raw.py",
        "src/gpuhost_agent/runtime/engine/client.py",
    }
    assert named_paths("tests/unit/core/x.py, other/core/x.py") == set()


def test_every_module_named_by_its_path_exists():
    missing: dict[str, set[str]] = {}
    for path in _files():
        if path != Path(__file__):
            for named in named_paths(path.read_text(errors="replace")):
                module = ROOT / (named if named.startswith("src/") else f"src/gpuhost_agent/{named}")
                if not module.exists():
                    missing.setdefault(named, set()).add(path.relative_to(ROOT).as_posix())
    listed = "\n".join(f"  {named}: named in {', '.join(sorted(where))}" for named, where in sorted(missing.items()))
    assert not missing, f"modules named by a path that does not exist:\n{listed}"

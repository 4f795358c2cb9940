"""The sandbox corpus (tests/sandbox_corpus/): hostile and legitimate Compose
files, each with a header saying what it tries or shows (see its README). The
headers are read once, at import."""

from __future__ import annotations

import functools
import re
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "sandbox_corpus"
HOSTILE = sorted((CORPUS / "hostile").glob("*.yaml"))
LEGIT = sorted((CORPUS / "legit").glob("*.yaml"))


@functools.cache
def header(path: Path) -> dict:
    fields = {}
    for line in path.read_text().splitlines():
        match = re.match(r"#\s*([a-z-]+):\s*(.*)", line)
        if not match:
            break
        fields[match.group(1)] = match.group(2).strip()
    return fields


for _path in HOSTILE + LEGIT:  # read once here, not on a test's event loop
    header(_path)

"""Small JSON state files written so that a crash leaves the old file or the
new one, never half of either: write a private temporary file, fsync, rename."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomically(path: Path, data: Any) -> None:
    """Owner-only (0600) in an owner-only directory: state files hold keys and
    assignments that are nobody else's business."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        # One string, then one write: json.dump runs the pure-Python encoder and
        # writes each fragment separately, ~10x slower on the marketplace's store.
        handle.write(json.dumps(data))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)

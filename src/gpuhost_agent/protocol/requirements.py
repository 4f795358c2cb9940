"""The marketplace's minimums for a host it rents out: a shape of the agent
protocol (the session reply's `requirements`), read by the agent's compliance
checks and sent by the local marketplace.

The defaults are used until the marketplace has spoken, and by
`gpuhost-agent doctor` when run offline. A marketplace cannot lower the
toolkit minimum below TOOLKIT_SAFE_VERSION (see inventory/compliance.py).

These defaults are also the only list of minimums: install.sh checks the same
versions before the agent is installed (INSTALL_SH_MINIMUMS names its
variables) and words a shortfall as `older_than` does. It holds copies, not a
generated text, because it runs before any Python is there and is served
byte for byte by the local marketplace; tests/unit/test_install_script.py
fails when a copy or its sentence drifts from here. Free disk and clock skew
are live figures, judged by `doctor` once installed (install.sh says to run it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from gpuhost_agent.protocol import wire_values

# The NVIDIA Container Toolkit release that fixed the known container escapes.
TOOLKIT_SAFE_VERSION = "1.17.8"

# install.sh's `readonly MIN_...=` variable -> the Requirements field it copies.
INSTALL_SH_MINIMUMS = {
    "MIN_DRIVER": "minDriverVersion",
    "MIN_CUDA": "minCudaVersion",
    "MIN_TOOLKIT": "minContainerToolkitVersion",
    "MIN_DOCKER": "minDockerVersion",
    "MIN_COMPOSE": "minComposeVersion",
}


@dataclass(frozen=True)
class Requirements:
    minDriverVersion: str = "535.0"
    minCudaVersion: str = "12.2"
    minContainerToolkitVersion: str = TOOLKIT_SAFE_VERSION
    minDockerVersion: str = "24.0"
    minComposeVersion: str = "2.20"
    minFreeDiskGiB: float = 50.0
    maxClockSkewSeconds: float = 5.0

    @classmethod
    def from_wire(cls, raw: object) -> Requirements:
        """The marketplace's values where they are well formed, defaults elsewhere."""
        values: dict[str, Any] = {}
        given = raw if isinstance(raw, dict) else {}
        for spec in fields(cls):
            value = given.get(spec.name)
            if spec.type == "str" and isinstance(value, str) and version_tuple(value):
                values[spec.name] = value
            elif spec.type == "float" and wire_values.is_number(value) and value >= 0:
                values[spec.name] = float(value)
        return cls(**values)


def version_tuple(text: str | None) -> tuple[int, ...]:
    """ "550.54.15" -> (550, 54, 15); "v2.29.1-desktop.1" -> (2, 29, 1); junk, or a
    version of more than 8 parts of 9 digits each (no real one), -> ()."""
    match = re.match(r"v?(\d{1,9}(?:\.\d{1,9}){0,7})(?![.\d])", (text or "").strip())
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def older_than(what: str, found: str, minimum: str) -> str:
    """The one wording of a version below its minimum, in doctor and install.sh:
    "Docker Engine 20.10.24 is older than the required 24.0"."""
    return f"{what} {found} is older than the required {minimum}"

"""Every package a lock names for this Python is installed at its locked version.

    python -m gpuhost_agent.common.lock_check LOCK [--installed FILE] [--python X.Y.Z]

Reads the lock's `name==version ; marker` lines (hashes ignored), keeps those
whose marker holds for the Python checked, and compares them with what is
installed: this interpreter's distributions, or a JSON object {name: version}
read from FILE (another environment's, as tests read a host's venv). Prints a
line a package that differs and exits 1; 0 and one line when all match.
`make setup` says so of dev.lock, an upgrade of its release's lock (the
release's dependencies are the installed agent's), tests of a host's venv.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import re
import sys

try:
    from packaging.markers import Marker
except ImportError:  # an environment without packaging: pip's own copy
    from pip._vendor.packaging.markers import Marker  # type: ignore[assignment]

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(text: str, python: str) -> dict[str, str]:
    """The lock's pins whose markers hold for `python` (X.Y.Z) on Linux/CPython."""
    env = {"python_version": ".".join(python.split(".")[:2]), "python_full_version": python,
           "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "platform_machine": platform.machine()}  # fmt: skip
    pins = {}
    for line in text.splitlines():
        match = PIN.match(line)
        if match and (match.group(3) is None or Marker(match.group(3)).evaluate(env)):
            pins[canonical(match.group(1))] = match.group(2)
    return pins


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lock")
    parser.add_argument("--installed", help="a JSON object {name: version}; default: this interpreter's")
    parser.add_argument("--python", default=platform.python_version(), help="X.Y.Z the markers are read for")
    args = parser.parse_args()
    with open(args.lock, encoding="utf-8") as file:
        pins = locked(file.read(), args.python)
    if args.installed:
        with open(args.installed, encoding="utf-8") as file:
            installed = {canonical(k): v for k, v in json.load(file).items()}
    else:
        installed = {canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    wrong = [f"{name}: locked {version}, installed {installed.get(name, 'nothing')}"
             for name, version in sorted(pins.items()) if installed.get(name) != version]  # fmt: skip
    for line in wrong:
        print(f"lock_check: {args.lock}: {line}", file=sys.stderr)
    if not wrong:
        print(f"lock_check: {len(pins)} packages of {args.lock} at their locked versions (Python {args.python})")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

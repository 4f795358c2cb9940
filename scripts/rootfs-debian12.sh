#!/usr/bin/env bash
# Build a minimal Debian 12 root file system for the install.sh tests, once,
# and cache it: tests/integration/test_install.py runs install.sh in it as a chroot, so
# the installer meets a fresh Debian 12 (python3, python3-venv, curl, systemd
# installed but not running; no Docker, no NVIDIA) without touching this
# machine. systemd is there for `systemctl enable` offline and for
# `systemd-analyze verify --root` of the unit as installed.
#
#   bash scripts/rootfs-debian12.sh [TARGET]     (default tests/.rootfs/debian12)
#
# Fast when the cache is current: TARGET/.gpuhost-rootfs-stamp holds this
# script's checksum, so editing the package list below rebuilds it. Packages
# come from the Debian mirror this machine's apt already uses (override with
# GPUHOST_ROOTFS_MIRROR); debootstrap is installed with apt when missing.
# Needs root (debootstrap creates device nodes and chroots).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
target=${1:-"$(cd "$here/.." && pwd)/tests/.rootfs/debian12"}
suite=bookworm
# procps: /bin/kill, which the unit's ExecReload= runs (every real host has it).
packages=python3,python3-venv,curl,ca-certificates,systemd,procps
stamp_value="$(sha256sum "$0" | cut -d' ' -f1)"
stamp="$target/.gpuhost-rootfs-stamp"

cached() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_value" ]; }
if cached; then
    echo "rootfs-debian12: cached at $target"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "rootfs-debian12: needs root (debootstrap and chroot)" >&2
    exit 1
fi
# One build at a time: a second test run waits for the first one's rootfs.
mkdir -p "$(dirname "$target")"
exec 9>"$target.lock"
flock 9
if cached; then
    echo "rootfs-debian12: cached at $target (built meanwhile)"
    exit 0
fi

# shellcheck source=scripts/rootfs-debian-lib.sh
source "$(dirname "$0")/rootfs-debian-lib.sh"
mirror=${GPUHOST_ROOTFS_MIRROR:-$(find_mirror)}

install_tool debootstrap rootfs-debian12
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
keyring_args=()
[ -r "$keyring" ] && keyring_args=(--keyring="$keyring")

# Build beside the target and rename at the end, so an interrupted build never
# looks like a cache. The parent is on the same file system, so mv is a rename.
work="$target.building.$$"
trap 'rm -rf "$work"' EXIT
echo "rootfs-debian12: debootstrap $suite from $mirror into $target (a few minutes, once)"
start=$SECONDS
# In a mount namespace of its own: debootstrap mounts /proc in the target
# (and with systemd included, leaves it mounted); those mounts end with it.
namespace=()
if unshare --mount --propagation private true 2>/dev/null; then
    namespace=(unshare --mount --propagation private)
fi
"${namespace[@]}" debootstrap --variant=minbase --include="$packages" "${keyring_args[@]}" \
    "$suite" "$work" "$mirror" >"$work.log" 2>&1 || {
    echo "rootfs-debian12: debootstrap failed; last lines of its log:" >&2
    tail -n 30 "$work.log" >&2
    rm -f "$work.log"
    exit 1
}
rm -f "$work.log"
# Without a namespace, unmount what debootstrap left mounted, deepest first.
awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r -n1 umount -l
# Downloaded .debs and package lists are dead weight in the cache.
rm -rf "$work"/var/cache/apt/archives/*.deb "$work"/var/lib/apt/lists/*_Packages
echo "$stamp_value" >"$work/.gpuhost-rootfs-stamp"
rm -rf "$target"
mv "$work" "$target"
trap - EXIT
echo "rootfs-debian12: ready in $((SECONDS - start)) s ($(du -sxh "$target" 2>/dev/null | cut -f1))"

#!/usr/bin/env bash
# Build a Debian 13 (trixie) root file system for the modern-host tests, once,
# and cache it: tests/support/modern_host.py boots it with systemd as PID 1 in
# a privileged container, so the agent meets what most GPU hosts run today:
# systemd 257, Debian's own docker.io (26.x) with the systemd cgroup driver,
# the Compose v2 plugin (docker-compose), btrfs tools for a /var/lib/docker
# whose containers' sizes the kernel caps (btrfs quota groups, dockerd's btrfs
# driver) and XFS tools for a prjquota one where the kernel has XFS quotas,
# python3 + venv and curl for install.sh.
#
#   bash scripts/rootfs-debian13.sh [TARGET]     (default tests/.rootfs/debian13)
#
# Fast when the cache is current: TARGET/.gpuhost-rootfs-stamp holds this
# script's checksum, so editing the package list below rebuilds it. Packages
# come from the Debian mirror this machine's apt already uses (override with
# GPUHOST_ROOTFS_MIRROR); the same registry serves trixie. mmdebstrap (apt's
# own dependency resolution, Recommends off) is installed with apt when
# missing. Needs root.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
target=${1:-"$(cd "$here/.." && pwd)/tests/.rootfs/debian13"}
suite=trixie
# docker-cli: the docker command (trixie splits it from docker.io, which only
# recommends it); systemd-sysv: /sbin/init; dbus: the systemd cgroup driver (runc, containerd)
# asks systemd for scopes over D-Bus; iptables: dockerd's bridge; procps:
# /bin/kill for the unit's ExecReload=; sudo: the marketplace's install line
# is `curl ... | sudo bash`; iproute2, util-linux: mounts and addresses.
packages=systemd,systemd-sysv,dbus,docker.io,docker-cli,docker-compose,containerd,runc,iptables,xfsprogs,btrfs-progs,python3,python3-venv
packages+=,curl,ca-certificates,procps,sudo,iproute2,util-linux,kmod
stamp_value="$(sha256sum "$0" | cut -d' ' -f1)"
stamp="$target/.gpuhost-rootfs-stamp"

cached() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_value" ]; }
if cached; then
    echo "rootfs-debian13: cached at $target"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "rootfs-debian13: needs root (mmdebstrap in root mode)" >&2
    exit 1
fi
# One build at a time: a second test run waits for the first one's rootfs.
mkdir -p "$(dirname "$target")"
exec 9>"$target.lock"
flock 9
if cached; then
    echo "rootfs-debian13: cached at $target (built meanwhile)"
    exit 0
fi

# shellcheck source=scripts/rootfs-debian-lib.sh
source "$(dirname "$0")/rootfs-debian-lib.sh"
mirror=${GPUHOST_ROOTFS_MIRROR:-$(find_mirror)}

install_tool mmdebstrap rootfs-debian13
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
keyring_args=()
[ -r "$keyring" ] && keyring_args=(--keyring="$keyring")

# Build beside the target and rename at the end, so an interrupted build never
# looks like a cache. The parent is on the same file system, so mv is a rename.
work="$target.building.$$"
trap 'rm -rf "$work" "$work.log"' EXIT
echo "rootfs-debian13: mmdebstrap $suite from $mirror into $target (a few minutes, once)"
start=$SECONDS
# --variant=apt: Essential + apt, then the list above through apt without
# Recommends (docker.io's would bring git, apparmor, needrestart...).
# The setup hook keeps services from starting while packages are configured.
mkdir -p "$work"
# In a mount namespace of its own: mmdebstrap mounts /proc (and more) in the
# target and can leave them mounted; those mounts end with it.
namespace=()
if unshare --mount --propagation private true 2>/dev/null; then
    namespace=(unshare --mount --propagation private)
fi
"${namespace[@]}" mmdebstrap --mode=root --variant=apt --include="$packages" "${keyring_args[@]}" \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -f "$1"/etc/machine-id && touch "$1"/etc/machine-id' \
    "$suite" "$work" "$mirror" >"$work.log" 2>&1 || {
    echo "rootfs-debian13: mmdebstrap failed; last lines of its log:" >&2
    tail -n 30 "$work.log" >&2
    exit 1
}
rm -f "$work.log"
# Without a namespace, unmount what mmdebstrap left mounted, deepest first.
awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r -n1 umount -l
# Downloaded .debs and package lists are dead weight in the cache.
rm -rf "$work"/var/cache/apt/archives/*.deb "$work"/var/lib/apt/lists/*_Packages
echo "$stamp_value" >"$work/.gpuhost-rootfs-stamp"
rm -rf "$target"
mv "$work" "$target"
trap - EXIT
echo "rootfs-debian13: ready in $((SECONDS - start)) s ($(du -sxh "$target" 2>/dev/null | cut -f1))"

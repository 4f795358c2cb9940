#!/usr/bin/env bash
# Run, on the GPU test machine, the bundle scripts/gpu-machine/build-bundle.sh
# made here: a Docker Engine of its
# own (Debian 13's dockerd 26 with CDI on, no runtime hook; no systemd, no
# iptables, cgroup v2 there), the agent in a virtual environment with its local
# marketplace (as `make run`), which writes its own CDI spec of the GPU from
# the driver, then scripts/gpu-machine/checks.py as a renter: the README's
# stack through its tunnel, a one-GPU rental whose container runs a CUDA
# program through the renter's terminal, the rental's cgroup limits. Writes
# OUT/gpu-machine-<GPU>.md (the summary) and OUT/gpu-machine-<GPU>.log
# (everything printed, the engine's and the agent's logs at the end). As root,
# from the checkout's root:
#
#   bash scripts/gpu-machine/run.sh BUNDLE_DIR OUT_DIR
#
# docs/hosts.md ("The GPU test machine") has the device call. Everything lives
# under GPU_RUN_DIR (default /tmp/gpuhost-gpu-run, removed first and at the
# end); the engine listens on its own socket, so it never meets another dockerd
# or containerd. GPU_RUN_DOCKERD_ARGS adds dockerd options (the test here:
# --bridge=none), GPU_RUN_LISTEN moves the local marketplace, GPU_RUN_HOLD sets
# how long the CUDA program holds its memory (default 35 s: a heartbeat sees
# it); the agent takes
# its settings' variables from the environment too (the test here points it at
# the stand-in NVML with GPUHOST_NVML_LIBRARY and FAKE_NVML_CONFIG, at a
# stand-in driver root with GPUHOST_DRIVER_ROOT, and names the stand-in's UUID
# in GPU_RUN_GPU_UUID).
set -uo pipefail

bundle=$(cd "${1:?usage: run.sh BUNDLE_DIR OUT_DIR}" && pwd)
out=${2:?usage: run.sh BUNDLE_DIR OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${GPU_RUN_DIR:-/tmp/gpuhost-gpu-run}
listen=${GPU_RUN_LISTEN:-127.0.0.1:8787}
key=gpu-machine-check-key

model=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)
# GPU_RUN_GPU_UUID: the UUID a stand-in NVML answers with, where no nvidia-smi is (the test here).
uuid=${GPU_RUN_GPU_UUID:-$(nvidia-smi -L 2>/dev/null | sed -n '1s/.*(UUID: \(GPU-[^)]*\)).*/\1/p')}
uuid_source="nvidia-smi -L"
stand_in=()
[ -z "${GPU_RUN_GPU_UUID:-}" ] || { uuid_source="GPU_RUN_GPU_UUID (a stand-in NVML's)"; stand_in=(--stand-in); }
tag=$(echo "${model:-no-GPU}" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
log="$out/gpu-machine-$tag.log"
summary="$out/gpu-machine-$tag.md"
exec > >(tee "$log") 2>&1
tee_pid=$!
say() { echo "[$(date -u +%T)] run.sh: $*"; }
fail() { say "FAILED: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "needs root (dockerd, cgroups)"
start=$SECONDS

agent_pid= dockerd_pid= containerd_pid=
cleanup() {
    local pid
    for pid in $agent_pid $dockerd_pid $containerd_pid; do
        kill -TERM "$pid" 2>/dev/null || continue
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    # Shims outlive containerd; their command lines name this run's folder.
    for pid in $(pgrep -f -- "-address $work/" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
    for file in dockerd.log containerd.log agent.log; do
        [ -f "$work/$file" ] || continue
        echo; echo "===== $file (last 80 lines) ====="
        tail -n 80 "$work/$file"
    done
    rm -rf "$work"
    # The log is whole before the call's files are taken: tee ends once run.sh's output closes.
    exec >&- 2>&-
    wait "$tee_pid" 2>/dev/null || true
}
trap cleanup EXIT

case $(stat -fc %T /sys/fs/cgroup) in
    cgroup2fs) cgroup="v2 (cgroup2fs at /sys/fs/cgroup)" ;;
    *) cgroup="v1 ($(stat -fc %T /sys/fs/cgroup) at /sys/fs/cgroup, a folder per controller)" ;;
esac
say "machine: $(uname -r), cgroup $cgroup, $(python3 --version 2>&1), GPU: ${model:-none}"
nvidia-smi -L 2>/dev/null
for tool in python3 xz tar; do command -v "$tool" >/dev/null || fail "no $tool on this machine"; done
rm -rf "$work"
mkdir -p "$work/engine" "$work/docker-config/cli-plugins" "$work/state"

say "unpacking $bundle/engine.tar.xz (beside the wheels' install)"
{ xz -dc "$bundle/engine.tar.xz" | tar -C "$work/engine" -xf -; } &
unpack_pid=$!

say "installing the agent's $(ls "$bundle"/wheels/*.whl | wc -l) wheels in $work/venv"
# The machine's own pip installs into a venv without one (pip 22.3 and newer:
# --python), 4 s where ensurepip takes 9; the venv's own pip otherwise.
python3 -m venv --without-pip "$work/venv" || fail "python3 -m venv failed"
if python3 -m pip --python "$work/venv/bin/python" --version >/dev/null 2>&1; then
    pip=(python3 -m pip --python "$work/venv/bin/python")
else
    "$work/venv/bin/python" -m ensurepip >/dev/null 2>&1 \
        || fail "no pip 22.3 or newer on this machine, and no ensurepip for the venv"
    pip=("$work/venv/bin/python" -m pip)
fi
"${pip[@]}" install -q --no-index --no-deps --no-compile --disable-pip-version-check "$bundle"/wheels/*.whl \
    || fail "the wheels did not install"
"$work/venv/bin/gpuhost-agent" version
wait "$unpack_pid" || fail "engine.tar.xz did not unpack"
cat "$work/engine/VERSIONS"
ln -s "$work/engine/cli-plugins/docker-compose" "$work/docker-config/cli-plugins/docker-compose"
missing=$(ldd "$work/engine/bin/dockerd" "$work/engine/bin/containerd" 2>&1 | grep 'not found' || true)
[ -z "$missing" ] || fail "the bundle's engine needs libraries this machine lacks: $missing"
# No runtime hook: GPUs reach containers by the CDI spec the agent writes from the driver.
export PATH="$work/engine/bin:$PATH"
export DOCKER_HOST="unix://$work/docker.sock" DOCKER_CONFIG="$work/docker-config"

# The disk share: dockerd's data root on XFS with project quotas, a sparse
# loop file, where the kernel has them; else on this machine's disk, and the check says why.
xfs_size=${GPU_RUN_XFS_SIZE:-16G}
rental_disk=${GPU_RUN_RENTAL_DISK:-256M}
agent_env=(GPUHOST_ALLOWED_REGISTRIES=127.0.0.1:5000)
mkdir -p "$work/data"
if [ "${GPU_RUN_XFS:-on}" = off ]; then
    xfs="not tried (GPU_RUN_XFS=off)"
elif ! truncate -s "$xfs_size" "$work/xfs.img" \
    || ! LD_LIBRARY_PATH="$work/engine/lib" mkfs.xfs -q "$work/xfs.img" >"$work/xfs.err" 2>&1; then
    xfs="mkfs.xfs failed: $(tail -n1 "$work/xfs.err")"
elif ! mount -o loop,prjquota "$work/xfs.img" "$work/data" >"$work/xfs.err" 2>&1; then
    kernel=$(dmesg 2>/dev/null | grep -i 'xfs (loop' | tail -n1 | sed 's/^\[[^]]*\] //')
    xfs="the kernel did not mount it with prjquota: ${kernel:-$(tail -n1 "$work/xfs.err")}"
else
    xfs="mounted: XFS with prjquota on a $xfs_size sparse loop file at $work/data, a rental's share $rental_disk"
    agent_env+=("GPUHOST_RENTAL_DISK=$rental_disk")
fi
rm -f "$work/xfs.img"  # the mount keeps it open; nothing is left once it is unmounted
say "disk share: $xfs"

say "starting containerd and dockerd (CDI on, --iptables=false --ip-masq=false ${GPU_RUN_DOCKERD_ARGS:-})"
# Configuration files of their own: a machine's /etc/containerd/config.toml or
# /etc/docker/daemon.json (the test machine here has both) must not apply.
printf 'version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n' >"$work/containerd.toml"
echo '{"features": {"cdi": true}}' >"$work/daemon.json"
mkdir -p "$work/cdi"
: >"$work/agent.conf"
setsid containerd --config "$work/containerd.toml" --root "$work/containerd" --state "$work/containerd-state" \
    --address "$work/containerd.sock" >"$work/containerd.log" 2>&1 </dev/null &
containerd_pid=$!
# CDI specs in a folder of this run's: the agent writes its own there (it is dockerd's first).
# shellcheck disable=SC2086  # GPU_RUN_DOCKERD_ARGS is a list of options
setsid dockerd --config-file "$work/daemon.json" --containerd "$work/containerd.sock" --cdi-spec-dir "$work/cdi" \
    --data-root "$work/data" --exec-root "$work/exec" --pidfile "$work/dockerd.pid" \
    --host "$DOCKER_HOST" --iptables=false --ip-masq=false ${GPU_RUN_DOCKERD_ARGS:-} \
    >"$work/dockerd.log" 2>&1 </dev/null &
dockerd_pid=$!
py="$work/venv/bin/python"
for _ in $(seq 120); do
    "$py" -c 'import docker; docker.from_env(timeout=2).ping()' 2>/dev/null && break
    kill -0 "$dockerd_pid" 2>/dev/null || fail "dockerd exited (its log is below)"
    sleep 0.5
done
"$py" -c 'import docker; docker.from_env(timeout=2).ping()' || fail "dockerd did not answer in 60 s"
"$work/engine/bin/dockerd" --version
"$work/docker-config/cli-plugins/docker-compose" version

say "loading the test images from the bundle (no registry here)"
"$py" - "$bundle/images.tar.xz" <<'EOF' || fail "docker load failed"
import lzma, sys, docker
with lzma.open(sys.argv[1]) as images:
    for image in docker.from_env(timeout=120).images.load(images.read()):
        print("loaded", image.tags, image.short_id)
EOF

say "starting the agent with its local marketplace on $listen"
# As `make run`: the local marketplace, a state directory of its own; no disk
# floor (the machine's scratch disk is small, and no deploy should wait on it);
# the bundle's Compose named, so that no other one on the machine stands in for it.
setsid env "${agent_env[@]}" "$work/venv/bin/gpuhost-agent" run \
    --config "$work/agent.conf" --state-dir "$work/state" --local-listen "$listen" --local-api-key "$key" \
    --disk-floor 0 --compose-command "$work/docker-config/cli-plugins/docker-compose" \
    >"$work/agent.log" 2>&1 </dev/null &
agent_pid=$!
base="http://$listen/v1"
for _ in $(seq 120); do
    "$py" -c 'import sys, urllib.request as u
r = u.Request(sys.argv[1] + "/environments", headers={"X-API-Key": sys.argv[2]})
sys.exit(0 if u.urlopen(r, timeout=2).status == 200 else 1)' "$base" "$key" 2>/dev/null && break
    kill -0 "$agent_pid" 2>/dev/null || fail "the agent exited (its log is below)"
    sleep 0.5
done
env_url=$(printf '%s/environments' "$base")
"$py" -c 'import sys, urllib.request as u
u.urlopen(u.Request(sys.argv[1], headers={"X-API-Key": sys.argv[2]}), timeout=5)' "$env_url" "$key" \
    || fail "the local marketplace did not answer on $listen in 60 s (the agent's log is below)"

say "the checks (scripts/gpu-machine/checks.py)"
"$py" "$repo/scripts/gpu-machine/checks.py" --base "$base" --key "$key" --summary "$summary" \
    --gpu-uuid "${uuid:-}" --gpu-uuid-source "$uuid_source" "${stand_in[@]}" --hold "${GPU_RUN_HOLD:-35}" \
    --xfs "$xfs" --rental-disk "$rental_disk" \
    --fact "GPU: ${model:-none}${model:+ ($(nvidia-smi --query-gpu=uuid,driver_version,memory.total --format=csv,noheader | head -n1))}" \
    --fact "kernel: $(uname -r) ($(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"))" \
    --fact "cgroup: $cgroup; PID 1: $(cat /proc/1/comm)" \
    --fact "python3: $(python3 --version 2>&1); iptables: $(command -v iptables || echo none)" \
    --fact "bundle: $(du -sh "$bundle" | cut -f1) ($(head -n1 "$bundle/MANIFEST" | sed 's/^# //'))" \
    --fact "the agent: $("$work/venv/bin/gpuhost-agent" version 2>&1 | head -n1)"
status=$?
say "checks ended with status $status after $((SECONDS - start)) s; summary: $summary"
exit "$status"

#!/usr/bin/env bash
# What the agent sees on a real NVIDIA machine: `probe --json`, `doctor`, and
# the facts around them (driver, device nodes, Docker, the container toolkit).
# Made for the lent GPU machines of the development workplace (docs/hardware/
# holds what it printed there), and usable on any host before an install.
#
#   bash scripts/hardware-check.sh OUT_DIR
#
# The agent comes from ./.whl when that folder holds its wheel and the
# dependencies the machine lacks (no registry is reachable there); otherwise
# from the gpuhost-agent on PATH. Every file is named after the GPU model.
set -u
out=${1:?usage: hardware-check.sh OUT_DIR}
mkdir -p "$out"

if ls .whl/gpuhost_agent-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpuhost-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/gpuhost-site
    agent() { python3 -c 'import sys; from gpuhost_agent.service.cli import main; sys.exit(main())' "$@"; }
else
    agent() { gpuhost-agent "$@"; }
fi

model=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
model=${model:-no-gpu}
tag=$(echo "$model" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
facts="$out/facts-$tag.txt"

section() { printf '\n## %s\n' "$*" >>"$facts"; }
run_into() { # run a command, output and exit status into the facts file
    printf '$ %s\n' "$*" >>"$facts"
    timeout 60 "$@" >>"$facts" 2>&1
    printf '(exit %s)\n' "$?" >>"$facts"
}

{
    echo "# hardware-check on $(hostname) at $(date -u +%FT%TZ)"
    echo "GPU model: $model"
} >"$facts"
section "machine"
run_into uname -a
run_into python3 --version
run_into nproc
run_into sh -c 'grep -E "MemTotal|MemAvailable" /proc/meminfo'
run_into sh -c 'stat -fc %T /sys/fs/cgroup; cat /proc/self/cgroup'
section "driver"
run_into nvidia-smi
run_into nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,memory.total,power.limit,ecc.mode.current,mig.mode.current --format=csv
run_into sh -c 'ls -la /dev/nvidia* /dev/nvidia-caps 2>&1'
run_into sh -c 'ldconfig -p | grep -E "libnvidia-ml|libcuda\.so"'
run_into sh -c 'ls /usr/local/nvidia/lib64 2>&1 | head -20'
section "containers"
run_into sh -c 'command -v docker dockerd containerd runc nvidia-ctk nvidia-container-cli nvidia-container-runtime-hook || true'
run_into sh -c 'docker info 2>&1 | head -40'
run_into sh -c 'ls -la /etc/nvidia-container-runtime 2>&1; cat /etc/nvidia-container-runtime/config.toml 2>&1 | head -40'
section "agent"
printf "$ gpuhost-agent version\n%s\n" "$(agent version 2>&1)" >>"$facts"

start=$(date +%s.%N)
agent probe --json >"$out/probe-$tag.json" 2>>"$facts"
echo "probe --json: exit $?, $(awk -v a="$start" -v b="$(date +%s.%N)" "BEGIN {printf \"%.2f\", b - a}") s" >>"$facts"
agent probe >"$out/probe-$tag.txt" 2>&1
echo "probe: exit $?" >>"$facts"
agent doctor >"$out/doctor-$tag.txt" 2>&1
echo "doctor: exit $?" >>"$facts"

# Where the driver's libraries sit off the loader's path (a driver folder
# mounted into a container or VM), the same probe with that folder named: a
# host whose driver is installed normally needs no such variable.
if grep -q "libnvidia-ml.so.1) not found" "$out/doctor-$tag.txt" && [ -e /usr/local/nvidia/lib64/libnvidia-ml.so.1 ]; then
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64 agent probe --json >"$out/probe-ldpath-$tag.json" 2>&1
    echo "probe --json with LD_LIBRARY_PATH=/usr/local/nvidia/lib64: exit $?" >>"$facts"
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64 agent doctor >"$out/doctor-ldpath-$tag.txt" 2>&1
    echo "doctor with LD_LIBRARY_PATH=/usr/local/nvidia/lib64: exit $?" >>"$facts"
fi
echo "files in $out, GPU model: $model"

#!/usr/bin/env bash
# Make sure a Docker engine answers. Reuse one that is already running;
# otherwise start dockerd by hand (no systemd here), detached, with a proxy
# trap so it can never pull from a public registry, and with the fake NVIDIA
# hook on its PATH so `--gpus` requests work on GPU-less machines.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
pidfile=/run/gpuhost-dockerd.pid

if docker info >/dev/null 2>&1; then
    echo "ensure-dockerd: using running engine at ${DOCKER_HOST:-unix:///var/run/docker.sock}" \
         "(server $(docker info --format '{{.ServerVersion}}'))"
    # The nvidia driver is only registered if that dockerd had the hook on its
    # PATH at startup; we can only vouch for a dockerd we started ourselves.
    if ! { [ -r "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }; then
        echo "ensure-dockerd: note: engine not started by this script; --gpus works only if" \
             "it has nvidia-container-runtime-hook on its PATH (see scripts/fake-nvidia)"
    fi
    exit 0
fi

if [ -n "${DOCKER_HOST:-}" ] && [ "$DOCKER_HOST" != unix:///var/run/docker.sock ]; then
    echo "ensure-dockerd: DOCKER_HOST=$DOCKER_HOST does not answer; not starting a local dockerd" >&2
    exit 1
fi
SUDO=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO=(sudo); fi

log=/var/log/gpuhost-dockerd.log
{ : >>"$log"; } 2>/dev/null || log=/tmp/gpuhost-dockerd.log
echo "ensure-dockerd: starting dockerd (log: $log)"

# The hook is copied out of the checkout first: dockerd runs it at every GPU
# container's start, and outlives the checkout that started it (a clone that
# ran test_engine_restart and was then deleted left every GPU container failing).
hooks=/run/gpuhost-test/fake-nvidia
"${SUDO[@]}" install -D -m 0755 "$here/fake-nvidia/nvidia-container-runtime-hook" "$hooks/nvidia-container-runtime-hook"

# HTTP(S)_PROXY points at the discard port, so any pull from a public registry
# fails at once; NO_PROXY keeps the local registry on 127.0.0.1:5000 reachable.
# setsid: own session, so dockerd outlives this script and its terminal.
setsid "${SUDO[@]}" env \
    HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 NO_PROXY=127.0.0.1,localhost \
    http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 no_proxy=127.0.0.1,localhost \
    PATH="$hooks:$PATH" \
    dockerd --pidfile "$pidfile" >>"$log" 2>&1 </dev/null &
dpid=$!

for _ in $(seq 60); do
    if docker info >/dev/null 2>&1; then
        echo "ensure-dockerd: dockerd up (pid $(cat "$pidfile" 2>/dev/null || echo "$dpid"))"
        exit 0
    fi
    kill -0 "$dpid" 2>/dev/null || break   # died early: no point waiting
    sleep 0.5
done
if kill -0 "$dpid" 2>/dev/null; then why="did not answer within 30 s"; else why="exited"; fi
echo "ensure-dockerd: dockerd $why; last log lines ($log):" >&2
tail -n 20 "$log" >&2
exit 1

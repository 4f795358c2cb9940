#!/usr/bin/env bash
# Build the offline test image and publish it to a local registry, so tests
# can exercise build, run and pull without ever touching a public registry.
#   gpuhost-test/busybox:1                  FROM scratch + static busybox
#   127.0.0.1:5000/gpuhost-test/busybox:1   same image, in the local registry
#   gpuhost-test/tls:1                      busybox + this machine's openssl and its
#                                           libraries: a real TLS origin (s_server) with
#                                           a self-signed certificate made at start
#   gpuhost-test/cuda-check:1               busybox + the GPU machine's CUDA program
#                                           (scripts/gpu-machine/cuda-check.c) and the C
#                                           library a driver's libcuda.so.1 loads; rebuilt
#                                           when the program's source changes
# Usage: build-test-images.sh [--force]   (--force rebuilds and re-pushes)
set -euo pipefail

image=gpuhost-test/busybox:1
registry=127.0.0.1:5000
force=0
[ "${1:-}" = --force ] && force=1

# --- image -------------------------------------------------------------------
if [ "$force" = 0 ] && docker image inspect "$image" >/dev/null 2>&1; then
    echo "build-test-images: $image already exists, skipping build"
else
    busybox=/bin/busybox
    # FROM scratch has no libc: a dynamically linked busybox would not run.
    if [ ! -x "$busybox" ] || ldd "$busybox" >/dev/null 2>&1; then
        echo "build-test-images: need a static $busybox (apt-get install busybox-static)" >&2
        exit 1
    fi
    ctx=$(mktemp -d)
    trap 'rm -rf "$ctx"' EXIT
    cp "$busybox" "$ctx/busybox"
    cat >"$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
CMD ["/bin/sh"]
DOCKERFILE
    echo "build-test-images: building $image"
    # Legacy builder: BuildKit is not reliable with Debian's dockerd 20.10.
    # Output kept for failures only (CLI 28 always warns that it is deprecated).
    if ! out=$(DOCKER_BUILDKIT=0 docker build -q -t "$image" "$ctx" 2>&1); then
        echo "$out" >&2
        exit 1
    fi
fi

# --- TLS origin image ----------------------------------------------------------
tls_image=gpuhost-test/tls:1
if [ "$force" = 0 ] && docker image inspect "$tls_image" >/dev/null 2>&1; then
    echo "build-test-images: $tls_image already exists, skipping build"
else
    openssl_bin=$(command -v openssl || true)
    if [ -z "$openssl_bin" ]; then
        echo "build-test-images: need openssl (apt-get install openssl)" >&2
        exit 1
    fi
    tls_ctx=$(mktemp -d)
    mkdir -p "$tls_ctx/root/usr/bin" "$tls_ctx/root/usr/lib/ssl"
    cp -L "$openssl_bin" "$tls_ctx/root/usr/bin/openssl"
    # The binary and the libraries it loads, at the same paths (ldd's list).
    for lib in $(ldd "$openssl_bin" | grep -o '/[^ ]*'); do
        mkdir -p "$tls_ctx/root$(dirname "$lib")"
        cp -L "$lib" "$tls_ctx/root$lib"
    done
    cp -L /usr/lib/ssl/openssl.cnf "$tls_ctx/root/usr/lib/ssl/openssl.cnf"
    printf 'FROM %s\nCOPY root/ /\n' "$image" >"$tls_ctx/Dockerfile"
    echo "build-test-images: building $tls_image"
    if ! out=$(DOCKER_BUILDKIT=0 docker build -q -t "$tls_image" "$tls_ctx" 2>&1); then
        echo "$out" >&2
        rm -rf "$tls_ctx"
        exit 1
    fi
    rm -rf "$tls_ctx"
fi

# --- CUDA check image ------------------------------------------------------------
# Nothing of CUDA inside: the driver's libraries come with the GPU (the agent's CDI
# spec mounts them into the C library's default folders).
cuda_image=gpuhost-test/cuda-check:1
cuda_src=$(cd "$(dirname "$0")/.." && pwd)/scripts/gpu-machine/cuda-check.c
cuda_sum=$(sha256sum "$cuda_src" | cut -d' ' -f1)
if [ "$force" = 0 ] && [ "$(docker image inspect -f '{{index .Config.Labels "io.gpuhost.test.source"}}' \
        "$cuda_image" 2>/dev/null)" = "$cuda_sum" ]; then
    echo "build-test-images: $cuda_image already exists, skipping build"
else
    command -v gcc >/dev/null || { echo "build-test-images: need gcc (apt-get install gcc)" >&2; exit 1; }
    cuda_ctx=$(mktemp -d)
    mkdir -p "$cuda_ctx/root/usr/local/bin"
    gcc -Wall -Wextra -Werror -O2 -std=gnu11 -o "$cuda_ctx/root/usr/local/bin/cuda-check" "$cuda_src" -ldl
    multiarch=/lib/$(gcc -print-multiarch)
    # The program's own libraries (ldd's list), and those libcuda.so.1 links besides.
    for lib in $(ldd "$cuda_ctx/root/usr/local/bin/cuda-check" | grep -o '/[^ ]*') \
        "$multiarch"/libm.so.6 "$multiarch"/libdl.so.2 "$multiarch"/libpthread.so.0 "$multiarch"/librt.so.1; do
        mkdir -p "$cuda_ctx/root$(dirname "$lib")"
        cp -L "$lib" "$cuda_ctx/root$lib"
    done
    printf 'FROM %s\nCOPY root/ /\nLABEL io.gpuhost.test.source=%s\n' "$image" "$cuda_sum" >"$cuda_ctx/Dockerfile"
    echo "build-test-images: building $cuda_image"
    if ! out=$(DOCKER_BUILDKIT=0 docker build -q -t "$cuda_image" "$cuda_ctx" 2>&1); then
        echo "$out" >&2
        rm -rf "$cuda_ctx"
        exit 1
    fi
    rm -rf "$cuda_ctx"
fi

# --- local registry ----------------------------------------------------------
if curl -fsS "http://$registry/v2/" >/dev/null 2>&1; then
    echo "build-test-images: registry already answering on $registry"
else
    dir=/var/lib/gpuhost-test-registry
    mkdir -p "$dir" 2>/dev/null || dir=/tmp/gpuhost-test-registry
    mkdir -p "$dir/data"
    # Our own config: loopback only (the packaged one binds :5000 on every
    # interface and wants htpasswd), no auth, deletes allowed for tests.
    cat >"$dir/config.yml" <<CONFIG
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: $registry
CONFIG
    echo "build-test-images: starting docker-registry on $registry (data/log: $dir)"
    # setsid: own session, so the registry outlives this script.
    setsid docker-registry serve "$dir/config.yml" >>"$dir/registry.log" 2>&1 </dev/null &
    rpid=$!
    echo "$rpid" >"$dir/registry.pid"
    for _ in $(seq 30); do
        curl -fsS "http://$registry/v2/" >/dev/null 2>&1 && break
        if ! kill -0 "$rpid" 2>/dev/null; then break; fi
        sleep 0.5
    done
    if ! curl -fsS "http://$registry/v2/" >/dev/null 2>&1; then
        echo "build-test-images: registry not answering (exited, or not up within 15 s); log tail:" >&2
        tail -n 20 "$dir/registry.log" >&2
        exit 1
    fi
fi

# --- push --------------------------------------------------------------------
remote=$registry/$image
if [ "$force" = 0 ] && curl -fsS "http://$registry/v2/${image%:*}/tags/list" 2>/dev/null \
        | grep "\"${image##*:}\"" >/dev/null; then
    echo "build-test-images: $remote already in registry, skipping push"
else
    echo "build-test-images: pushing $remote"
    docker tag "$image" "$remote"
    docker push -q "$remote" >/dev/null
fi

#!/usr/bin/env bash
# What the benchmarks need beyond the test images (run by `make bench`, not by CI):
#   wrk                  a load generator we did not write (Debian's package): many
#                        keep-alive connections, requests per second, latency percentiles
#   gpuhost-test/nginx:1 gpuhost-test/busybox:1 plus Debian's nginx binary and its
#                        libraries: an origin that keeps connections alive (busybox
#                        httpd closes every one) and serves files with sendfile
# nginx is unpacked from its .deb, never installed: the package would start a
# server on port 80 of every interface.
# Usage: build-bench-images.sh [--force]   (--force rebuilds the image)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
image=gpuhost-test/nginx:1
force=0
[ "${1:-}" = --force ] && force=1

if ! command -v wrk >/dev/null; then
    echo "build-bench-images: installing wrk"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get install -y -q wrk >/dev/null
fi

if [ "$force" = 0 ] && docker image inspect "$image" >/dev/null 2>&1; then
    echo "build-bench-images: $image already exists, skipping build"
    exit 0
fi
bash "$root/scripts/build-test-images.sh" >/dev/null

ctx=$(mktemp -d)
chmod 755 "$ctx"
trap 'rm -rf "$ctx"' EXIT
# apt-get download writes into the current directory as the _apt user.
(cd "$ctx" && apt-get download -q nginx >/dev/null 2>&1) || {
    echo "build-bench-images: 'apt-get download nginx' failed (run apt-get update?)" >&2
    exit 1
}
dpkg-deb -x "$ctx"/nginx_*.deb "$ctx/deb"
mkdir -p "$ctx/root/usr/sbin" "$ctx/root/etc/nginx"
cp "$ctx/deb/usr/sbin/nginx" "$ctx/root/usr/sbin/nginx"
for lib in $(ldd "$ctx/deb/usr/sbin/nginx" | grep -o '/[^ ]*'); do
    mkdir -p "$ctx/root$(dirname "$lib")"
    cp -L "$lib" "$ctx/root$lib"
done
# One process, no user switch (the sandbox drops CAP_SETUID), every path it
# writes under /www, which the stack's command creates; no access log, so the
# origin costs the same on both paths and little on either.
cat >"$ctx/root/etc/nginx/nginx.conf" <<'CONF'
daemon off;
master_process off;
worker_processes 1;
pid /www/nginx.pid;
error_log stderr warn;
events { worker_connections 4096; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    client_body_temp_path /www/.body;
    proxy_temp_path /www/.proxy;
    fastcgi_temp_path /www/.fastcgi;
    uwsgi_temp_path /www/.uwsgi;
    scgi_temp_path /www/.scgi;
    default_type application/octet-stream;
    server {
        listen 8080;
        root /www;
    }
}
CONF
# nginx looks up its worker user even when it never switches to it.
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$ctx/root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$ctx/root/etc/group"
printf 'FROM gpuhost-test/busybox:1\nCOPY root/ /\n' >"$ctx/Dockerfile"
echo "build-bench-images: building $image"
if ! out=$(DOCKER_BUILDKIT=0 docker build -q -t "$image" "$ctx" 2>&1); then
    echo "$out" >&2
    exit 1
fi

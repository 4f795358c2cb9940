#!/bin/sh
# A WebSocket echo server (RFC 6455) in busybox sh for one connection on
# stdin/stdout, run per connection by `nc -ll -e`: the handshake, then every
# short frame (< 126 bytes) the client sends comes back unmasked. A stand-in
# only because the offline images have no WebSocket server; the client in the
# tests is a real one (aiohttp), which checks the handshake and the framing.
key=""
while IFS= read -r line; do
    line=$(printf '%s' "$line" | tr -d '\r')
    [ -z "$line" ] && break
    case "$line" in
        [Ss]ec-[Ww]eb[Ss]ocket-[Kk]ey:*) key=$(printf '%s' "${line#*:}" | tr -d ' ') ;;
    esac
done
accept=$(printf '%s258EAFA5-E914-47DA-95CA-C5AB0DC85B11' "$key" | sha1sum | cut -c1-40 | xxd -r -p | base64)
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n' "$accept"
while :; do
    set -- $(dd bs=1 count=2 2>/dev/null | od -An -tu1)
    [ $# -eq 2 ] || exit 0
    op=$(($1 & 15)); len=$(($2 & 127))
    [ "$len" -lt 126 ] || exit 0
    set -- $(dd bs=1 count=4 2>/dev/null | od -An -tu1)
    m0=$1; m1=$2; m2=$3; m3=$4; out=""; i=0
    for b in $(dd bs=1 count="$len" 2>/dev/null | od -An -tu1 -v); do
        case $((i % 4)) in 0) m=$m0 ;; 1) m=$m1 ;; 2) m=$m2 ;; *) m=$m3 ;; esac
        out="$out\\$(printf '%03o' $((b ^ m)))"; i=$((i + 1))
    done
    if [ "$op" -eq 8 ]; then printf '\210\000'; exit 0; fi
    printf "\\$(printf '%03o' $((128 | op)))\\$(printf '%03o' "$len")$out"
done

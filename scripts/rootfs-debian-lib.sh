# Sourced by the rootfs scripts (rootfs-debian12.sh, rootfs-debian13.sh): the
# Debian mirror this machine's apt uses, and a build tool installed with apt
# when missing. Written once here; each script names its own tool.

# The first Debian archive URI apt is configured with (deb822 .sources or
# one-line sources.list), skipping the security archive.
find_mirror() {
    local file uri
    for file in /etc/apt/sources.list.d/*.sources; do
        [ -r "$file" ] || continue
        uri=$(awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i }' "$file" \
              | grep -v -- '-security' | grep '/debian/\?$' | head -n1 || true)
        if [ -n "$uri" ]; then echo "$uri"; return; fi
    done
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$file" ] || continue
        uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; break } }' "$file" \
              | grep -v -- '-security' | grep '/debian/\?$' | head -n1 || true)
        if [ -n "$uri" ]; then echo "$uri"; return; fi
    done
    echo http://deb.debian.org/debian
}

# install_tool NAME WHO: NAME (a command and its Debian package) with apt, if missing.
install_tool() {
    command -v "$1" >/dev/null 2>&1 && return
    echo "$2: installing $1 with apt"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "$1" >/dev/null \
        || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$1" >/dev/null; }
}

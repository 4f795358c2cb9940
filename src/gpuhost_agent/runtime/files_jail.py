"""The file helper of SFTP and SCP: a process confined to one container.

Run as `python -I -m gpuhost_agent.runtime.files_jail PID USER` by
runtime/container_files.py. Before it reads a single request it joins the
container's cgroups (so the container's device rules and limits bind it),
enters the container's mount namespace (its root becomes the container's root
file system, volumes included), takes the container's user and groups from the
container's own /etc/passwd and /etc/group, keeps no capability the container
lacks, and sets no_new_privs. A path then means what it means inside the
container: `/etc/shadow`, or a symlink to it, is the container's file, and no
`..` or absolute link leads out, because there is no "out" in this process's
view. Any step that fails ends the helper before it serves anything.

Only regular files are opened (FIFOs and device nodes are refused), one
request is served at a time, and every size is capped, so a renter's client
cannot make the helper block or grow (runtime/files_ops.py).

Everything it needs is imported before it enters the container: from then on
the host's Python library is out of its reach.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

from gpuhost_agent.runtime.files_ops import serve, write_frame

CLONE_NEWNS = 0x00020000
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
CAP_VERSION_3 = 0x20080522
LAST_CAP = 40

_libc = ctypes.CDLL(None, use_errno=True)


class Refused(Exception):
    """The helper cannot confine itself; it serves nothing."""


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise Refused(f"{what}: {os.strerror(code)}")


# ---- confinement ---------------------------------------------------------------
def _status_caps(pid: int) -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
    return int(fields["CapEff"].strip(), 16), int(fields["CapBnd"].strip(), 16)


def _join_cgroups(pid: int) -> None:
    """Into every cgroup of the container's init: v1 hierarchies by their
    controllers, the v2 one by its path."""
    for line in open(f"/proc/{pid}/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers:
            name = controllers.replace("name=", "")
            base = f"/sys/fs/cgroup/{name}"
        else:
            base = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
        target = f"{base}{path}/cgroup.procs"
        if not os.path.exists(target):
            if controllers.startswith("name=") or not controllers and base.endswith("unified"):
                continue  # a bookkeeping hierarchy the host does not mount
            raise Refused(f"the container's cgroup {target} is not there")
        with open(target, "w") as procs:
            procs.write(str(os.getpid()))


def _user_entry(spec: str) -> tuple[int, int, list[int], str]:
    """(uid, gid, groups, home) for Docker's User ("", "name", "1000", "u:g"),
    read from the container's own files (no NSS: its libraries are not ours).
    No user means root, as for Docker, with or without an /etc/passwd."""
    user, _, group = spec.partition(":")
    user = user or "0"
    passwd = _table("/etc/passwd")
    entry = next((row for row in passwd if user in (row[0], row[2])), None)
    if entry is None and not user.isdigit():
        raise Refused(f"user {user!r} is not in the container's /etc/passwd")
    uid = int(entry[2]) if entry else int(user)
    gid = int(entry[3]) if entry and entry[3].isdigit() else uid
    home = entry[5] if entry and len(entry) > 5 else "/"
    groups_table = _table("/etc/group")
    if group:
        found = next((row for row in groups_table if group in (row[0], row[2])), None)
        if found is None and not group.isdigit():
            raise Refused(f"group {group!r} is not in the container's /etc/group")
        gid = int(found[2]) if found else int(group)
    name = entry[0] if entry else ""
    extra = [int(row[2]) for row in groups_table if len(row) > 3 and name and name in row[3].split(",")]
    return uid, gid, sorted({gid, *extra}), home or "/"


def _table(path: str) -> list[list[str]]:
    try:
        with open(path, errors="replace") as table:
            rows = [line.rstrip("\n").split(":") for line in table.read(1024 * 1024).splitlines()]
    except OSError:
        return []
    return [row for row in rows if len(row) >= 4 and row[2].isdigit()]


def _keep_caps(effective: int, bounding: int) -> None:
    """Root inside the container: no capability the container does not have."""
    for cap in range(LAST_CAP + 1):
        if not bounding >> cap & 1:
            _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last cap
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    low, high = effective & 0xFFFFFFFF, effective >> 32
    data = (ctypes.c_uint32 * 6)(low, low, 0, high, high, 0)  # effective, permitted, inheritable x2
    _check(_libc.capset(header, data), "capset")


def confine(pid: int, user: str) -> str:
    """Become the container's file-side twin; returns the user's home."""
    if os.stat(f"/proc/{pid}/ns/user").st_ino != os.stat("/proc/self/ns/user").st_ino:
        raise Refused("the container runs in a user namespace of its own (userns-remap): not supported")
    effective, bounding = _status_caps(pid)
    namespace = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    _join_cgroups(pid)
    _check(_libc.setns(namespace, CLONE_NEWNS), "entering the container's mount namespace")
    os.close(namespace)
    os.chdir("/")
    uid, gid, groups, home = _user_entry(user)
    os.setgroups(groups)
    os.setgid(gid)
    if uid == 0:
        _keep_caps(effective, bounding)
    else:
        os.setuid(uid)  # drops every capability
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    try:
        os.chdir(home)
    except OSError:
        home = "/"
    return home


def main(argv: list[str]) -> int:
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    try:
        home = confine(int(argv[1]), argv[2] if len(argv) > 2 else "")
    except (Refused, OSError, ValueError, IndexError, KeyError) as exc:
        write_frame(sink, {"errno": errno.EPERM, "error": f"cannot enter the container: {exc}"[:500]})
        return 1
    write_frame(sink, {"ok": home})
    serve(source, sink)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

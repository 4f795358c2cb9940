"""The file helper of SFTP and SCP: a process bound to one container's files.

Run as `python -I -m gpuhost_agent.runtime.files_jail PID USER CONTAINER_ID`
by runtime/container_files.py. It never enters the container's mount
namespace: everything it runs and loads is the host's, and the container's
files are only data read and written through fds. Before it reads a single
request it:

- pins the container's init (runtime/container_process.py): a pidfd, then
  /proc/PID/root opened as a directory fd, then the cgroups must name the
  container's id and the pidfd must still be alive (a recycled pid is
  refused);
- joins the container's cgroups, so its device rules and limits bind the helper;
- takes the container's user and groups from the container's own /etc/passwd
  and /etc/group, read through the root fd (no NSS);
- keeps no capability the container lacks, and of those only the ones files
  need (chown, DAC override and read-search, fowner, fsetid); sets no_new_privs.

Every path is then resolved by the kernel under the root fd
(runtime/files_paths.py): `/etc/shadow`, or a symlink to it, or `../..`, is
the container's. Any step that fails ends the helper before it serves
anything; once serving, every request gets an answer (runtime/files_ops.py).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

from gpuhost_agent.errors import Refusal
from gpuhost_agent.runtime.container_process import PinnedProcess
from gpuhost_agent.runtime.files_ops import Files, serve, write_frame
from gpuhost_agent.runtime.files_paths import Root, reopen

PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
CAP_VERSION_3 = 0x20080522
LAST_CAP = 63
FILE_CAPS = 0b11111  # CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID
MAX_TABLE = 1024 * 1024

_libc = ctypes.CDLL(None, use_errno=True)


class JailRefused(Refusal):
    """The helper cannot confine itself; it serves nothing."""


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise JailRefused(f"{what}: {os.strerror(code)}")


def _status_caps(status: str) -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["CapEff"].strip(), 16), int(fields["CapBnd"].strip(), 16)


def _join_cgroups(cgroup: str) -> None:
    """Into every cgroup of the container's init: v1 hierarchies by their
    controllers, the v2 one by its path (as the kernel listed them)."""
    for line in cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if ".." in path.split("/"):
            raise JailRefused(f"an odd cgroup path {path!r}")
        if controllers:
            base = f"/sys/fs/cgroup/{controllers.replace('name=', '')}"
        else:
            base = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
        target = f"{base}{path}/cgroup.procs"
        if not os.path.exists(target):
            if controllers.startswith("name=") or not controllers and base.endswith("unified"):
                continue  # a bookkeeping hierarchy the host does not mount
            raise JailRefused(f"the container's cgroup {target} is not there")
        with open(target, "w") as procs:
            procs.write(str(os.getpid()))


def _table(root: Root, path: str) -> list[list[str]]:
    """A passwd-like file of the container's, as data (a regular file only, capped)."""
    try:
        fd = root.open(path)
        try:
            opened = reopen(fd, os.O_RDONLY)
        finally:
            os.close(fd)
        try:
            raw = b""
            while len(raw) < MAX_TABLE and (chunk := os.read(opened, MAX_TABLE - len(raw))):
                raw += chunk
        finally:
            os.close(opened)
    except OSError:
        return []
    rows = [line.split(":") for line in raw.decode("utf-8", "replace").splitlines()]
    return [row for row in rows if len(row) >= 4 and row[2].isdigit()]


def _user_entry(root: Root, spec: str) -> tuple[int, int, list[int], str]:
    """(uid, gid, groups, home) for Docker's User ("", "name", "1000", "u:g"),
    read from the container's own files (no NSS: its libraries are not ours).
    No user means root, as for Docker, with or without an /etc/passwd."""
    user, _, group = spec.partition(":")
    user = user or "0"
    entry = next((row for row in _table(root, "/etc/passwd") if user in (row[0], row[2])), None)
    if entry is None and not user.isdigit():
        raise JailRefused(f"user {user!r} is not in the container's /etc/passwd")
    uid = int(entry[2]) if entry else int(user)
    gid = int(entry[3]) if entry and entry[3].isdigit() else uid
    home = entry[5] if entry and len(entry) > 5 else "/"
    groups_table = _table(root, "/etc/group")
    if group:
        found = next((row for row in groups_table if group in (row[0], row[2])), None)
        if found is None and not group.isdigit():
            raise JailRefused(f"group {group!r} is not in the container's /etc/group")
        gid = int(found[2]) if found else int(group)
    name = entry[0] if entry else ""
    extra = [int(row[2]) for row in groups_table if len(row) > 3 and name and name in row[3].split(",")]
    if max(uid, gid, *extra) >= 2**32 - 1:
        raise JailRefused("a user or group id out of range")
    return uid, gid, sorted({gid, *extra}), home or "/"


def _keep_caps(effective: int, bounding: int) -> None:
    """Root inside the container: no capability it lacks, and only those files need."""
    keep = effective & bounding & FILE_CAPS
    for cap in range(LAST_CAP + 1):
        if not keep >> cap & 1:
            _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last cap
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)(keep, keep, 0, 0, 0, 0)  # effective, permitted, inheritable x2
    _check(_libc.capset(header, data), "capset")


def _home(root: Root, home: str) -> str:
    """The user's home as a path inside the container, or / where it is not a directory there."""
    try:
        fd = root.open(home, os.O_PATH | os.O_DIRECTORY) if home.startswith("/") else -1
    except OSError:
        fd = -1
    if fd < 0:
        return "/"
    try:
        return root.name_of(fd)
    except OSError:
        return "/"
    finally:
        os.close(fd)


def confine(pid: int, user: str, container_id: str) -> Files:
    """Pin the container, bind this process to it; its files under its root."""
    with PinnedProcess(pid, container_id) as process:
        if os.stat(f"/proc/{pid}/ns/user").st_ino != os.stat("/proc/self/ns/user").st_ino:
            raise JailRefused("the container runs in a user namespace of its own (userns-remap): not supported")
        effective, bounding = _status_caps(process.read("status"))
        root = Root(process.open("root", os.O_PATH | os.O_DIRECTORY))
        cgroup = process.confirm()
    try:
        os.close(root.open("/"))
    except OSError as exc:
        raise JailRefused(f"resolving paths in the container needs openat2 (Linux 5.6 or later): {exc}") from None
    _join_cgroups(cgroup)
    uid, gid, groups, home = _user_entry(root, user)
    os.setgroups(groups)
    os.setgid(gid)
    if uid == 0:
        _keep_caps(effective, bounding)
    else:
        os.setuid(uid)  # drops every capability
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    root.home = _home(root, home)
    return Files(root)


def main(argv: list[str]) -> int:
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    try:
        files = confine(int(argv[1]), argv[2] if len(argv) > 2 else "", argv[3] if len(argv) > 3 else "")
    except Exception as exc:  # noqa: BLE001 - said to the agent, never a traceback
        write_frame(sink, {"errno": errno.EPERM, "error": f"cannot enter the container: {exc}"[:500]})
        return 1
    write_frame(sink, {"ok": files.root.home})
    serve(source, sink, files)
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv)
    except BaseException:  # noqa: BLE001 - the agent hung up mid-answer: end without a word
        code = 1
    os._exit(code)

"""Paths inside a container's root, resolved by the kernel (the SFTP helper's, runtime/files_ops.py).

The helper never enters the container's mount namespace and never passes a
full path string to a system call. It holds the container's root as a
directory fd (/proc/PID/root) and resolves every path with openat2(2) under
RESOLVE_IN_ROOT: `..`, absolute paths and absolute symlinks stop at that
root, as chroot would make them, while the mounts under it (volumes) are
crossed as the container sees them. RESOLVE_NO_MAGICLINKS refuses /proc's
magic links (/proc/1/root, /proc/self/fd/N in the container's /proc).
Anything that changes a directory works on one name under a parent's fd.

Files are opened in two steps: an O_PATH fd first, which opens nothing; its
type and file system are checked (a regular file, on no kernel file system
like /proc or /sys, whose files answer for the opener's namespaces, the
host's here); then the very inode is reopened through /proc/self/fd/N. A
device node, a FIFO or a socket is never opened, whatever the image holds.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
import stat

SYS_OPENAT2 = 437  # one number on every architecture (x86_64 and aarch64 alike)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
RENAME_NOREPLACE = 1
MAX_PATH = 4096
# statfs f_type of kernel file systems: proc, sysfs, cgroup v1/v2, debugfs, tracefs, securityfs,
# bpf, configfs, pstore, efivarfs, selinuxfs, binfmt_misc, fusectl, nsfs
KERNEL_FS = frozenset(
    {0x9FA0, 0x62656572, 0x27E0EB, 0x63677270, 0x64626720, 0x74726163, 0x73636673, 0xCAFE4A11}
    | {0x62656570, 0x6165676C, 0xDE5E81E4, 0xF97CFF8C, 0x42494E4D, 0x65735543, 0x6E736673}
)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _raise(what: str) -> None:
    code = ctypes.get_errno() or errno.EIO
    raise OSError(code, f"{what}: {os.strerror(code)}")


def checked_path(path: object) -> bytes:
    if not isinstance(path, str):
        raise OSError(errno.EINVAL, "a path is a string")
    encoded = os.fsencode(path)
    if b"\0" in encoded or len(encoded) > MAX_PATH:
        raise OSError(errno.EINVAL, "not a usable path")
    return encoded or b"."


def openat2(dir_fd: int, path: bytes, flags: int) -> int:
    """An fd for `path` under `dir_fd`, resolved as if `dir_fd` were the root."""
    how = _OpenHow(flags | os.O_CLOEXEC, 0, RESOLVE)
    fd = _libc.syscall(SYS_OPENAT2, dir_fd, path, ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        _raise("openat2")
    return int(fd)


def fs_type(fd: int) -> int:
    buffer = ctypes.create_string_buffer(256)  # struct statfs; f_type comes first
    if _libc.fstatfs(fd, buffer) != 0:
        _raise("fstatfs")
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF


def reopen(fd: int, flags: int) -> int:
    """A real fd (O_RDONLY, O_WRONLY, ...) for the regular file an O_PATH fd names."""
    before = os.fstat(fd)
    if stat.S_ISDIR(before.st_mode):
        raise OSError(errno.EISDIR, "a directory")
    if not stat.S_ISREG(before.st_mode):
        raise OSError(errno.EACCES, "only regular files can be opened")
    if fs_type(fd) in KERNEL_FS:
        raise OSError(errno.EACCES, "a file of the kernel's (/proc, /sys): not opened")
    opened = os.open(f"/proc/self/fd/{fd}", flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    after = os.fstat(opened)
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(after.st_mode):
        os.close(opened)
        raise OSError(errno.EACCES, "the file changed under the helper")
    os.set_blocking(opened, True)
    return opened


def renameat2(old_dir: int, old: bytes, new_dir: int, new: bytes, replace: bool) -> None:
    if _libc.renameat2(old_dir, old, new_dir, new, 0 if replace else RENAME_NOREPLACE) != 0:
        _raise("rename")


class Root:
    """A container's root directory fd, and paths resolved under it."""

    def __init__(self, fd: int, home: str = "/"):
        self.fd, self.home = fd, home

    def absolute(self, path: object) -> bytes:
        encoded = checked_path(path)
        return encoded if encoded.startswith(b"/") else os.fsencode(self.home).rstrip(b"/") + b"/" + encoded

    def open(self, path: object, flags: int = os.O_PATH, *, follow: bool = True) -> int:
        return openat2(self.fd, self.absolute(path), flags | (0 if follow else os.O_NOFOLLOW))

    def parent(self, path: object) -> tuple[int, bytes]:
        """(an O_PATH fd of the parent directory, the last name): for calls that change a directory."""
        head, name = posixpath.split(self.absolute(path).rstrip(b"/") or b"/")
        if name in (b"", b".", b".."):
            raise OSError(errno.EINVAL, "the path names no entry of a directory")
        return openat2(self.fd, head or b"/", os.O_PATH | os.O_DIRECTORY), name

    def name_of(self, fd: int) -> str:
        """The path under the root of what `fd` is (from the kernel's name of
        it, checked by resolving that path again to the same file)."""
        base, named = (os.readlink(f"/proc/self/fd/{each}") for each in (self.fd, fd))
        if base != "/":
            named = named[len(base) :] if named.startswith(base + "/") else "/" if named == base else ""
        if named.startswith("/"):
            try:
                again = openat2(self.fd, os.fsencode(named), os.O_PATH | os.O_NOFOLLOW)
            except OSError:
                again = -1
            if again >= 0:
                same = (os.fstat(again).st_dev, os.fstat(again).st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
                os.close(again)
                if same:
                    return named
        raise OSError(errno.ENOENT, "no path under the root names it")

"""The file operations of the SFTP helper, and its framing (runtime/files_jail.py).

Every path is resolved by the kernel under the container's root fd
(runtime/files_paths.py); every call that changes a directory names one
entry under its parent's fd; files are read and written through fds only.
Only regular files are opened, so a FIFO cannot block the helper and a
device node is never opened; every size and number is checked before use.

Frames: `>II` (JSON length, data length), the JSON request or answer, then
raw bytes (a read's data, a write's data). Every request gets an answer:
whatever goes wrong (bad JSON, a wrong type, an offset of 2**64-1, a bug),
the answer is an errno, never a traceback, and the helper serves on.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from gpuhost_agent.runtime.files_paths import KERNEL_FS, Root, checked_path, fs_type, renameat2, reopen

FRAME = struct.Struct(">II")
MAX_JSON = 64 * 1024  # a request
MAX_ANSWER = 4 * 1024 * 1024  # an answer's JSON (a listing)
MAX_DATA = 256 * 1024  # SFTP clients read and write 32-256 KiB at a time
MAX_HANDLES = 64
MAX_LISTING = 20_000
MAX_OFFSET = 2**63 - 1
ACCESS = os.O_RDONLY | os.O_WRONLY | os.O_RDWR
MODES = os.O_TRUNC | os.O_APPEND


def _number(value: Any, low: int = 0, high: int = MAX_OFFSET) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise OSError(errno.EINVAL, "a number out of range")
    return value


def _stat(result: os.stat_result) -> list[int]:
    """mode, ino, dev, nlink, uid, gid, size, then atime, mtime, ctime in ns."""
    return [int(result[i]) for i in range(7)] + [result.st_atime_ns, result.st_mtime_ns, result.st_ctime_ns]


class Files:
    """The operations SFTP needs, on the files under one root fd."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.handles: dict[int, int] = {}

    def _fd(self, handle: Any) -> int:
        if isinstance(handle, bool) or not isinstance(handle, int) or handle not in self.handles:
            raise OSError(errno.EBADF, "no such open file")
        return self.handles[handle]

    @contextmanager
    def _at(self, path: Any, flags: int = os.O_PATH, follow: bool = True) -> Iterator[int]:
        fd = self.root.open(path, flags, follow=follow)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _parent(self, path: Any) -> Iterator[tuple[int, bytes]]:
        parent, name = self.root.parent(path)
        try:
            if fs_type(parent) in KERNEL_FS:
                raise OSError(errno.EACCES, "a directory of the kernel's (/proc, /sys): not changed")
            yield parent, name
        finally:
            os.close(parent)

    def realpath(self, path: str) -> str:
        try:
            with self._at(path) as fd:
                return self.root.name_of(fd)
        except FileNotFoundError:  # a name not there yet (a target to create): its directory's path
            with self._parent(path) as (parent, name):
                return posixpath.join(self.root.name_of(parent), os.fsdecode(name))

    def stat(self, path: str) -> list[int]:
        with self._at(path) as fd:
            return _stat(os.fstat(fd))

    def lstat(self, path: str) -> list[int]:
        with self._at(path, follow=False) as fd:
            return _stat(os.fstat(fd))

    def fstat(self, handle: int) -> list[int]:
        return _stat(os.fstat(self._fd(handle)))

    def open(self, path: str, flags: int, mode: int) -> int:
        flags, mode = _number(flags, 0, 2**31 - 1), _number(mode, 0, 2**32 - 1) & 0o7777
        if len(self.handles) >= MAX_HANDLES:
            raise OSError(errno.EMFILE, f"at most {MAX_HANDLES} open files per session")
        wanted = flags & (ACCESS | MODES)
        try:
            existing = self.root.open(path)
        except FileNotFoundError:
            if not flags & os.O_CREAT:
                raise
            with self._parent(path) as (parent, name):  # a new file: regular, made here, never followed
                create = wanted | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
                fd = os.open(name, create, mode, dir_fd=parent)
        else:
            try:
                if flags & os.O_CREAT and flags & os.O_EXCL:
                    raise OSError(errno.EEXIST, "the file exists")
                fd = reopen(existing, wanted)
            finally:
                os.close(existing)
        handle = max(self.handles, default=0) + 1
        self.handles[handle] = fd
        return handle

    def read(self, handle: int, offset: int, size: int) -> bytes:
        fd, offset, size = self._fd(handle), _number(offset), _number(size)
        return os.pread(fd, min(size, MAX_DATA), offset)

    def write(self, handle: int, offset: int, data: bytes) -> int:
        return os.pwrite(self._fd(handle), data, _number(offset))

    def close(self, handle: int) -> None:
        if isinstance(handle, int) and handle in self.handles:  # closing twice is no error, as before
            os.close(self.handles.pop(handle))

    def listdir(self, path: str) -> list[list[Any]]:
        entries: list[list[Any]] = []
        size = 0
        with self._at(path, os.O_RDONLY | os.O_DIRECTORY) as fd, os.scandir(fd) as scan:
            for entry in scan:
                entries.append([os.fsdecode(entry.name), _stat(entry.stat(follow_symlinks=False))])
                size += len(json.dumps(entries[-1])) + 2
                if len(entries) >= MAX_LISTING or size > MAX_ANSWER - MAX_JSON:
                    break
        return entries

    def mkdir(self, path: str, mode: int) -> None:
        mode = _number(mode, 0, 2**32 - 1) & 0o7777
        with self._parent(path) as (parent, name):
            os.mkdir(name, mode, dir_fd=parent)

    def rmdir(self, path: str) -> None:
        with self._parent(path) as (parent, name):
            os.rmdir(name, dir_fd=parent)

    def remove(self, path: str) -> None:
        with self._parent(path) as (parent, name):
            os.unlink(name, dir_fd=parent)

    def rename(self, old: str, new: str, replace: bool = False) -> None:
        """SFTP's rename keeps an existing target (EEXIST); posix-rename replaces it."""
        if not isinstance(replace, bool):
            raise OSError(errno.EINVAL, "replace is true or false")
        with self._parent(old) as (old_parent, old_name), self._parent(new) as (new_parent, new_name):
            renameat2(old_parent, old_name, new_parent, new_name, replace)

    def readlink(self, path: str) -> str:
        with self._parent(path) as (parent, name):
            return os.fsdecode(os.readlink(name, dir_fd=parent))

    def symlink(self, target: str, path: str) -> None:
        target_bytes = checked_path(target)  # only stored: it is resolved under the root when used
        with self._parent(path) as (parent, name):
            os.symlink(target_bytes, name, dir_fd=parent)

    def setstat(self, path: str, attrs: dict) -> None:
        with self._at(path) as fd:
            if fs_type(fd) in KERNEL_FS:
                raise OSError(errno.EACCES, "a file of the kernel's (/proc, /sys): not changed")
            self._apply(fd, attrs, f"/proc/self/fd/{fd}")

    def fsetstat(self, handle: int, attrs: dict) -> None:
        fd = self._fd(handle)
        self._apply(fd, attrs, fd)

    def statvfs(self, path: str) -> list[int]:
        with self._at(path) as fd:
            result = os.statvfs(fd)
        return [int(result[i]) for i in range(10)]

    def _apply(self, fd: int, attrs: Any, target: str | int) -> None:
        """Size, owner, mode, times; `target` the fd itself, or its /proc/self/fd path for an O_PATH fd."""
        if not isinstance(attrs, dict):
            raise OSError(errno.EINVAL, "attributes are an object")
        size, uid, gid, mode, atime, mtime = (
            attrs.get(key) for key in ("size", "uid", "gid", "mode", "atime", "mtime")
        )
        if size is not None:
            size = _number(size)
            writable = reopen(fd, os.O_WRONLY) if isinstance(target, str) else fd
            try:
                os.ftruncate(writable, size)
            finally:
                os.close(writable) if writable != fd else None
        if uid is not None or gid is not None:
            owner = [-1 if value is None else _number(value, 0, 2**32 - 2) for value in (uid, gid)]
            os.chown(target, owner[0], owner[1])
        if mode is not None:
            os.chmod(target, _number(mode, 0, 2**32 - 1) & 0o7777)
        if atime is not None and mtime is not None:
            os.utime(target, ns=(_number(atime, -(2**33), 2**33) * 10**9, _number(mtime, -(2**33), 2**33) * 10**9))


OPERATIONS = frozenset(name for name in vars(Files) if not name.startswith("_"))


def _read_frame(source: BinaryIO) -> tuple[bytes, bytes] | None:
    """(request, data); a frame over the limits is read to its end and answered E2BIG."""
    head = source.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    json_length, data_length = FRAME.unpack(head)
    if json_length > MAX_JSON or data_length > MAX_DATA:
        left = json_length + data_length
        while left > 0 and (chunk := source.read(min(left, MAX_DATA))):
            left -= len(chunk)
        return b"", b""
    request = source.read(json_length)
    return request, source.read(data_length) if data_length else b""


def write_frame(sink: BinaryIO, message: dict, data: bytes = b"") -> None:
    encoded = json.dumps(message).encode()
    sink.write(FRAME.pack(len(encoded), len(data)) + encoded + data)
    sink.flush()


def answer(files: Files, request: bytes, data: bytes) -> tuple[dict, bytes]:
    """The answer to one request, whatever the request: nothing raised gets past here."""
    try:
        if not request:
            raise OSError(errno.E2BIG, "request too large")
        message = json.loads(request.decode("utf-8"))
        if not isinstance(message, dict):
            raise OSError(errno.EINVAL, "a request is a JSON object")
        op, args = message.get("op"), message.get("args", [])
        if not isinstance(op, str) or op not in OPERATIONS:
            raise OSError(errno.ENOSYS, f"unknown operation {str(op)[:40]!r}")
        if not isinstance(args, list):
            raise OSError(errno.EINVAL, "args are a list")
        result = getattr(files, op)(*args, data) if op == "write" else getattr(files, op)(*args)
    except OSError as exc:
        code = exc.errno if isinstance(exc.errno, int) and exc.errno > 0 else errno.EIO
        return {"errno": code, "error": str(exc.strerror or os.strerror(code))[:200]}, b""
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        return {"errno": errno.EINVAL, "error": f"bad request ({type(exc).__name__})"}, b""
    except Exception as exc:  # noqa: BLE001 - the helper's boundary: an error frame, never a traceback
        return {"errno": errno.EIO, "error": f"the helper failed ({type(exc).__name__})"}, b""
    if isinstance(result, bytes):
        return {"ok": len(result)}, result
    return {"ok": result}, b""


def serve(source: BinaryIO, sink: BinaryIO, files: Files) -> None:
    while (frame := _read_frame(source)) is not None:
        write_frame(sink, *answer(files, *frame))

"""The file operations of the SFTP helper, and its framing (runtime/files_jail.py).

Plain os calls on the helper's view of the file system, which by the time any
of this runs is the container's (files_jail.confine). Only regular files are
opened, so a FIFO cannot block the helper and a device node is never read;
every size is capped. Frames: `>II` (JSON length, data length), the JSON
request or answer, then raw bytes (a read's data, a write's data).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
from typing import Any, BinaryIO

FRAME = struct.Struct(">II")
MAX_JSON = 64 * 1024
MAX_DATA = 256 * 1024  # SFTP clients read and write 32-256 KiB at a time
MAX_HANDLES = 64
MAX_LISTING = 20_000
OPEN_FLAGS = os.O_RDONLY | os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_EXCL


def _stat(result: os.stat_result) -> list[int]:
    """mode, ino, dev, nlink, uid, gid, size, then atime, mtime, ctime in ns."""
    return [int(result[i]) for i in range(7)] + [result.st_atime_ns, result.st_mtime_ns, result.st_ctime_ns]


class Files:
    """The operations SFTP needs, on this process's view of the file system."""

    def __init__(self) -> None:
        self.handles: dict[int, int] = {}

    def _fd(self, handle: Any) -> int:
        if handle not in self.handles:
            raise OSError(errno.EBADF, "no such open file")
        return self.handles[handle]

    def realpath(self, path: str) -> str:
        return os.path.realpath(path or ".")

    def stat(self, path: str) -> list[int]:
        return _stat(os.stat(path))

    def lstat(self, path: str) -> list[int]:
        return _stat(os.lstat(path))

    def fstat(self, handle: int) -> list[int]:
        return _stat(os.fstat(self._fd(handle)))

    def open(self, path: str, flags: int, mode: int) -> int:
        if len(self.handles) >= MAX_HANDLES:
            raise OSError(errno.EMFILE, f"at most {MAX_HANDLES} open files per session")
        fd = os.open(path, (flags & OPEN_FLAGS) | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, mode & 0o7777)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EACCES, "only regular files can be opened")
        os.set_blocking(fd, True)
        handle = max(self.handles, default=0) + 1
        self.handles[handle] = fd
        return handle

    def read(self, handle: int, offset: int, size: int) -> bytes:
        return os.pread(self._fd(handle), min(size, MAX_DATA), offset)

    def write(self, handle: int, offset: int, data: bytes) -> int:
        return os.pwrite(self._fd(handle), data, offset)

    def close(self, handle: int) -> None:
        os.close(self.handles.pop(handle, -1)) if handle in self.handles else None

    def listdir(self, path: str) -> list[list[Any]]:
        entries: list[list[Any]] = []
        with os.scandir(path) as scan:
            for entry in scan:
                entries.append([os.fsdecode(entry.name), _stat(entry.stat(follow_symlinks=False))])
                if len(entries) >= MAX_LISTING:
                    break
        return entries

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(path, mode & 0o7777)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def remove(self, path: str) -> None:
        os.unlink(path)

    def rename(self, old: str, new: str, replace: bool = False) -> None:
        """SFTP's rename keeps an existing target (EEXIST); posix-rename replaces it."""
        if not replace and os.path.lexists(new):
            raise OSError(errno.EEXIST, "the target exists")
        os.rename(old, new)

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def symlink(self, target: str, path: str) -> None:
        os.symlink(target, path)

    def setstat(self, path: str, attrs: dict) -> None:
        self._apply(path, attrs)

    def fsetstat(self, handle: int, attrs: dict) -> None:
        self._apply(self._fd(handle), attrs)

    def statvfs(self, path: str) -> list[int]:
        result = os.statvfs(path)
        return [int(result[i]) for i in range(10)]

    def _apply(self, target: str | int, attrs: dict) -> None:
        if attrs.get("size") is not None:
            os.truncate(target, int(attrs["size"]))
        if attrs.get("uid") is not None or attrs.get("gid") is not None:
            os.chown(target, int(attrs.get("uid", -1) or -1), int(attrs.get("gid", -1) or -1))
        if attrs.get("mode") is not None:
            os.chmod(target, int(attrs["mode"]) & 0o7777)
        if attrs.get("atime") is not None and attrs.get("mtime") is not None:
            os.utime(target, (float(attrs["atime"]), float(attrs["mtime"])))


def _read_frame(source: BinaryIO) -> tuple[dict, bytes] | None:
    head = source.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    json_length, data_length = FRAME.unpack(head)
    if json_length > MAX_JSON or data_length > MAX_DATA:
        raise ValueError("request too large")
    message = json.loads(source.read(json_length))
    return message, source.read(data_length) if data_length else b""


def write_frame(sink: BinaryIO, message: dict, data: bytes = b"") -> None:
    encoded = json.dumps(message).encode()
    sink.write(FRAME.pack(len(encoded), len(data)) + encoded + data)
    sink.flush()


OPERATIONS = frozenset(name for name in vars(Files) if not name.startswith("_"))


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    files = Files()
    while (frame := _read_frame(source)) is not None:
        message, data = frame
        op, args = message.get("op"), message.get("args") or []
        try:
            if op not in OPERATIONS or not isinstance(args, list):
                raise OSError(errno.ENOSYS, f"unknown operation {str(op)[:40]!r}")
            if op == "write":
                args = [*args, data]
            result = getattr(files, op)(*args)
        except OSError as exc:
            write_frame(sink, {"errno": exc.errno or errno.EIO, "error": exc.strerror or str(exc)})
        except (TypeError, ValueError) as exc:
            write_frame(sink, {"errno": errno.EINVAL, "error": f"bad request: {exc}"[:200]})
        else:
            if isinstance(result, bytes):
                write_frame(sink, {"ok": len(result)}, result)
            else:
                write_frame(sink, {"ok": result})

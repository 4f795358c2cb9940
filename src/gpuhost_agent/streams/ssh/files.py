"""SFTP (and SCP, which asyncssh serves through the same object) into a container.

asyncssh speaks the protocol; every file operation goes to a helper confined
to the container (runtime/container_files.py), so the image needs no SSH tools
and no path, symlink or `..` can name a host file. Paths come from the client
as bytes and go to the helper as they are (decoded with surrogateescape, so
names that are not UTF-8 survive the JSON).

Every method of asyncssh's SFTPServer is defined here, never inherited: its
defaults act on the agent's own file system, as root (`link` is os.link,
`lsetstat` chmod and chown, `scandir` os.scandir, `format_user` the host's
passwd), and a renter's `ln` or `chmod -h` in sftp reached host files that
way. What the helper does not do is refused (SFTPOpUnsupported);
tests/unit/test_ssh_files_methods.py fails when asyncssh grows a method this
class does not define.

asyncssh serves the `copy-data` extension itself, as a loop of this class's
read and write until a read comes back short. Within one file, copying
forward (`remote_copy(f, f, 0, 0, n)`) never comes back short: each read
finds what the last write put ahead, and the loop fills the rental's disk
while it keeps a helper and the agent busy. Its writes are told apart from a
client's by the data itself (the very object the last read returned, which a
client's bytes from the network never are), and one onto the file it reads
from, at or past where it reads, is refused (OpenSSH's sftp-server refuses an
overlapping copy-data the same way).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import asyncssh

from gpuhost_agent.runtime.container_files import ContainerFiles
from gpuhost_agent.runtime.files_ops import MAX_DATA


def _path(path: bytes) -> str:
    return os.fsdecode(path)


def _stat(values: Any) -> os.stat_result:
    """The helper's [mode, ino, dev, nlink, uid, gid, size, atime_ns, mtime_ns,
    ctime_ns] as the stat_result asyncssh reads (seconds and nanoseconds)."""
    head = [int(v) for v in values[:7]]
    times = dict(zip(("atime", "mtime", "ctime"), (int(v) for v in values[7:10]), strict=True))
    extra = {f"st_{name}": ns / 1e9 for name, ns in times.items()}
    extra.update({f"st_{name}_ns": ns for name, ns in times.items()})
    return os.stat_result((*head, *(ns // 1_000_000_000 for ns in times.values())), extra)


def _attrs(attrs: asyncssh.SFTPAttrs) -> dict:
    return {
        "size": attrs.size,
        "uid": attrs.uid,
        "gid": attrs.gid,
        "mode": attrs.permissions,
        "atime": attrs.atime,
        "mtime": attrs.mtime,
    }


class ContainerSFTP(asyncssh.SFTPServer):
    """One SFTP session's view of one container. The open-file objects asyncssh
    keeps are the helper's handles (small integers)."""

    def __init__(self, chan: asyncssh.SSHServerChannel, files: ContainerFiles):
        super().__init__(chan)
        self._files = files
        self._last_read: tuple[object, int, bytes] | None = None  # (file, offset, data): see the docstring

    async def _call(self, op: str, *args: Any) -> Any:
        result, _ = await self._files.call(op, *args)
        return result

    async def realpath(self, path: bytes) -> bytes:
        text = _path(path) or "."
        if not text.startswith("/"):
            text = f"{self._files.home.rstrip('/')}/{text}"
        return os.fsencode(await self._call("realpath", text))

    async def stat(self, path: bytes) -> os.stat_result:
        return _stat(await self._call("stat", _path(path)))

    async def lstat(self, path: bytes) -> os.stat_result:
        return _stat(await self._call("lstat", _path(path)))

    async def fstat(self, file_obj: object) -> os.stat_result:
        return _stat(await self._call("fstat", file_obj))

    async def open(self, path: bytes, pflags: int, attrs: asyncssh.SFTPAttrs) -> object:
        flags = 0
        if pflags & asyncssh.FXF_READ and pflags & asyncssh.FXF_WRITE:
            flags = os.O_RDWR
        elif pflags & asyncssh.FXF_WRITE:
            flags = os.O_WRONLY
        for sftp_flag, os_flag in (
            (asyncssh.FXF_APPEND, os.O_APPEND),
            (asyncssh.FXF_CREAT, os.O_CREAT),
            (asyncssh.FXF_TRUNC, os.O_TRUNC),
            (asyncssh.FXF_EXCL, os.O_EXCL),
        ):
            if pflags & sftp_flag:
                flags |= os_flag
        mode = attrs.permissions if attrs.permissions is not None else 0o644
        return await self._call("open", _path(path), flags, mode)

    async def read(self, file_obj: object, offset: int, size: int) -> bytes:
        _, data = await self._files.call("read", file_obj, offset, min(size, MAX_DATA))
        self._last_read = (file_obj, offset, data)
        return data

    async def write(self, file_obj: object, offset: int, data: bytes) -> int:
        if self._last_read is not None and data is self._last_read[2] and data:
            await self._copy_within_checked(file_obj, offset)
        written = 0
        while written < len(data):  # a client may send more than the helper takes at once
            piece = data[written : written + MAX_DATA]
            count, _ = await self._files.call("write", file_obj, offset + written, data=piece)
            written += int(count)
        return written

    async def _copy_within_checked(self, file_obj: object, offset: int) -> None:
        """A copy-data write (see the docstring): refused onto the file it
        copies from at or past the read, where the copy would never end."""
        assert self._last_read is not None
        source, read_at, _data = self._last_read
        if offset < read_at:
            return
        same = file_obj == source
        if not same:
            here, there = await self._call("fstat", file_obj), await self._call("fstat", source)
            same = (here[1], here[2]) == (there[1], there[2])  # inode and device
        if same:
            raise asyncssh.SFTPFailure("copy-data forward within one file would never end: not served")

    async def close(self, file_obj: object) -> None:
        await self._call("close", file_obj)

    async def listdir(self, path: bytes) -> list[asyncssh.SFTPName]:
        entries = [[".", await self._call("stat", _path(path))]]
        entries += await self._call("listdir", _path(path))
        return [
            asyncssh.SFTPName(os.fsencode(name), attrs=asyncssh.SFTPAttrs.from_local(_stat(values)))
            for name, values in entries
        ]

    async def mkdir(self, path: bytes, attrs: asyncssh.SFTPAttrs) -> None:
        await self._call("mkdir", _path(path), attrs.permissions if attrs.permissions is not None else 0o755)

    async def rmdir(self, path: bytes) -> None:
        await self._call("rmdir", _path(path))

    async def remove(self, path: bytes) -> None:
        await self._call("remove", _path(path))

    async def rename(self, oldpath: bytes, newpath: bytes) -> None:
        await self._call("rename", _path(oldpath), _path(newpath))

    async def posix_rename(self, oldpath: bytes, newpath: bytes) -> None:
        await self._call("rename", _path(oldpath), _path(newpath), True)

    async def readlink(self, path: bytes) -> bytes:
        return os.fsencode(await self._call("readlink", _path(path)))

    async def symlink(self, oldpath: bytes, newpath: bytes) -> None:
        await self._call("symlink", _path(oldpath), _path(newpath))

    async def setstat(self, path: bytes, attrs: asyncssh.SFTPAttrs) -> None:
        await self._call("setstat", _path(path), _attrs(attrs))

    async def fsetstat(self, file_obj: object, attrs: asyncssh.SFTPAttrs) -> None:
        await self._call("fsetstat", file_obj, _attrs(attrs))

    async def statvfs(self, path: bytes) -> asyncssh.SFTPVFSAttrs:
        return asyncssh.SFTPVFSAttrs.from_local(os.statvfs_result(await self._call("statvfs", _path(path))))

    async def scandir(self, path: bytes) -> AsyncIterator[asyncssh.SFTPName]:
        for name in await self.listdir(path):
            yield name

    # ---- not served: each would otherwise be asyncssh's default on the host's files
    def _refuse(self, what: str) -> NoReturn:
        raise asyncssh.SFTPOpUnsupported(f"{what} is not served in a container's files")

    async def link(self, oldpath: bytes, newpath: bytes) -> None:
        self._refuse("a hard link")

    async def lsetstat(self, path: bytes, attrs: asyncssh.SFTPAttrs) -> None:
        self._refuse("changing a symbolic link itself (chmod -h)")

    async def fsync(self, file_obj: object) -> None:
        self._refuse("fsync")

    async def fstatvfs(self, file_obj: object) -> asyncssh.SFTPVFSAttrs:
        self._refuse("fstatvfs")

    async def lock(self, file_obj: object, offset: int, length: int, flags: int) -> None:
        self._refuse("a byte range lock")

    async def unlock(self, file_obj: object, offset: int, length: int) -> None:
        self._refuse("a byte range lock")

    async def open56(self, path: bytes, desired_access: int, flags: int, attrs: asyncssh.SFTPAttrs) -> object:
        self._refuse("SFTP version 5 and 6 open")

    # ---- pure: names and paths as the container's own numbers, no host lookup
    def format_user(self, uid: int | None) -> str:
        return "" if uid is None else str(uid)

    def format_group(self, gid: int | None) -> str:
        return "" if gid is None else str(gid)

    def map_path(self, path: bytes) -> bytes:
        return path  # every path goes to the helper, which resolves it inside the container

    def reverse_map_path(self, path: bytes) -> bytes:
        return path

    def format_longname(self, name: asyncssh.SFTPName) -> Any:
        return super().format_longname(name)  # formatting alone, with the user and group above

    async def convert_attrs(self, result: Any) -> asyncssh.SFTPAttrs:
        return await super().convert_attrs(result)  # a conversion of what a method above returned

    async def exit(self) -> None:
        """The session ends: the helper goes, and the channel gets exit status
        0 as from OpenSSH's sftp-server (asyncssh would close it without one,
        which OpenSSH's scp reports as a failed copy)."""
        await self._files.close()
        self.channel.exit(0)

"""The SFTP file helper (runtime/files_jail.py) against a hostile container, on the real engine.

The container's image is crafted from a tar (`docker import`): at the very
paths where the host's Python keeps its library and the agent's own modules,
it plants sentinels that, if ever imported or used as a codec, write a marker
into the container's root; it also holds device nodes, a FIFO and symlinks
(absolute, `../`, through /proc) aimed at a secret file on the host. The
helper is driven frame by frame, as the agent drives it, with absurd
arguments (an offset of 2**64-1, negative numbers, huge sizes, wrong types,
bad JSON). Whatever arrives, the host's secret never comes back, no device or
FIFO is opened, no planted file is loaded, and every bad request is answered
as an error while the helper goes on serving.

The helper is also given a process that is not the container's (a pid whose
cgroup names another container, a host process, a pid that is gone): it
refuses to start.

Through the agent's own SSH, a real SFTP client (asyncssh's) reads at an
offset of 2**64-1 in a container whose files plant the same sentinels:
an error, the session goes on, OpenSSH's sftp still works, nothing ran.
"""

from __future__ import annotations

import asyncio
import encodings
import errno
import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import asyncssh
import pytest
from support.ssh_clients import Endpoint, registered_key, ssh_ready
from support.stacks import TEST_IMAGE

import gpuhost_agent.runtime.files_jail as files_jail
import gpuhost_agent.runtime.files_ops as files_ops
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.files_ops import FRAME

SENTINEL = 'open("/pwned-" + __name__, "w").write("ran")\n'
STDLIB = os.path.dirname(os.__file__)
PLANTED = [
    f"{encodings.__path__[0]}/pwnedcodec.py",
    *(f"{STDLIB}/{name}.py" for name in ("linecache", "traceback", "locale", "sitecustomize", "tokenize", "codecs")),
    f"{STDLIB}/lib-dynload/_pwned.py",
]
AGENT_SOURCES = [files_ops.__file__, files_jail.__file__]  # a traceback would read them, and their coding cookie


def _entry(tar: tarfile.TarFile, name: str, kind: bytes, *, data=b"", link="", dev=(0, 0), mode=0, owner=0) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.type, info.mode, info.size = kind, mode or (0o644 if kind == tarfile.REGTYPE else 0o777), len(data)
    info.uid = info.gid = owner
    info.linkname, (info.devmajor, info.devminor) = link, dev
    tar.addfile(info, io.BytesIO(data) if data else None)


def _dirs(tar: tarfile.TarFile, path: str, made: set[str]) -> None:
    parts = path.strip("/").split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        name = "/".join(parts[:depth])
        if name not in made:
            made.add(name)
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)


def _image(secret: Path) -> str:
    """The busybox test image's files plus the planted ones, imported as a new image."""
    base = subprocess.run(["docker", "create", TEST_IMAGE, "true"], capture_output=True, text=True, check=True)
    container = base.stdout.strip()
    try:
        exported = subprocess.run(["docker", "export", container], capture_output=True, check=True).stdout
    finally:
        subprocess.run(["docker", "rm", container], capture_output=True, check=False)
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(exported)) as source, tarfile.open(fileobj=out, mode="w") as tar:
        made: set[str] = set()
        for member in source.getmembers():
            tar.addfile(member, source.extractfile(member) if member.isfile() else None)
            made.add(member.name.rstrip("/"))
        for path in PLANTED:
            _dirs(tar, path, made)
            _entry(tar, path, tarfile.REGTYPE, data=SENTINEL.encode())
        for path in AGENT_SOURCES:
            _dirs(tar, path, made)
            _entry(tar, path, tarfile.REGTYPE, data=f"# coding: pwnedcodec\n{SENTINEL}".encode())
        _dirs(tar, "/leak/x", made)
        _dirs(tar, "/etc/x", made)
        _entry(
            tar, "/etc/passwd", tarfile.REGTYPE, data=b"root:x:0:0::/root:/bin/sh\nrenter:x:1000:1000::/home/renter:\n"
        )
        _entry(tar, "/etc/group", tarfile.REGTYPE, data=b"root:x:0:\nrenter:x:1000:\nshared:x:2000:renter\n")
        _dirs(tar, "/home/x", made)
        _entry(tar, "/home/renter", tarfile.DIRTYPE, mode=0o700, owner=1000)
        _entry(tar, "/leak/rootonly", tarfile.REGTYPE, data=b"root only\n", mode=0o600)
        _entry(tar, "/leak/file", tarfile.REGTYPE, data=b"container file\n")
        _entry(tar, "/leak/zero", tarfile.CHRTYPE, dev=(1, 5))
        _entry(tar, "/leak/mem", tarfile.CHRTYPE, dev=(1, 1))
        _entry(tar, "/leak/fifo", tarfile.FIFOTYPE)
        _entry(tar, "/leak/host", tarfile.SYMTYPE, link=str(secret))
        _entry(tar, "/leak/up", tarfile.SYMTYPE, link="../" * 12 + str(secret).lstrip("/"))
        _entry(tar, "/leak/proc", tarfile.SYMTYPE, link=f"/proc/1/root{secret}")
        _entry(tar, "/leak/self", tarfile.SYMTYPE, link=f"/proc/self/root{secret}")
        _entry(tar, "/leak/cwd", tarfile.SYMTYPE, link=f"/proc/self/cwd/{secret.name}")
    tag = f"gpuhost-test/files-escape:{uuid.uuid4().hex[:12]}"
    subprocess.run(["docker", "import", "-", tag], input=out.getvalue(), capture_output=True, check=True)
    return tag


@pytest.fixture
def hostile(tmp_path):
    """(container id, its init's pid, the host's secret, the image) for one hostile container."""
    secret = tmp_path / f"host-secret-{uuid.uuid4().hex}"
    secret.write_text(f"HOST SECRET {uuid.uuid4().hex}\n")
    os.chmod(tmp_path, 0o755)
    image = _image(secret)
    volume = f"files-escape-{uuid.uuid4().hex[:12]}"
    plant = f"ln -s {secret} /data/host; ln -s {'../' * 12}{str(secret).lstrip('/')} /data/up; exec sleep 600"
    name = f"files-escape-{uuid.uuid4().hex[:12]}"
    run = ["docker", "run", "-d", "--name", name, "-v", f"{volume}:/data", image, "/bin/sh", "-c", plant]
    container = subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip()
    try:
        pid = int(
            subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Pid}}", container], capture_output=True, text=True, check=True
            ).stdout
        )
        yield container, pid, secret, image
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
        subprocess.run(["docker", "volume", "rm", volume], capture_output=True, check=False)
        subprocess.run(["docker", "rmi", image], capture_output=True, check=False)


class Helper:
    """The helper as the agent starts it, driven frame by frame."""

    def __init__(self, pid: int, container: str, user: str = ""):
        command = [sys.executable, "-I", "-m", "gpuhost_agent.runtime.files_jail", str(pid), user, container]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def raw(self, request: bytes, data: bytes = b"") -> tuple[dict | None, bytes]:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(FRAME.pack(len(request), len(data)) + request + data)
            self.process.stdin.flush()
        except BrokenPipeError:
            return None, b""
        return self.answer()

    def answer(self) -> tuple[dict | None, bytes]:
        assert self.process.stdout is not None
        head = self.process.stdout.read(FRAME.size)
        if len(head) < FRAME.size:
            return None, b""  # the helper died
        json_length, data_length = FRAME.unpack(head)
        return json.loads(self.process.stdout.read(json_length)), self.process.stdout.read(data_length)

    def call(self, op: str, *args) -> tuple[dict | None, bytes]:
        return self.raw(json.dumps({"op": op, "args": list(args)}).encode())

    def end(self) -> bytes:
        assert self.process.stdin is not None and self.process.stderr is not None
        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.process.stderr.read()


def _markers(pid: int) -> list[str]:
    return sorted(name for name in os.listdir(f"/proc/{pid}/root") if name.startswith("pwned"))


def test_absurd_requests_are_errors_and_nothing_planted_ever_loads(hostile):
    container, pid, _secret, _image = hostile
    helper = Helper(pid, container)
    try:
        assert helper.answer()[0] == {"ok": "/root"}
        handle = helper.call("open", "/leak/file", os.O_RDONLY, 0)[0]
        assert handle == {"ok": 1}, handle
        absurd = [
            ("read", 1, 2**64 - 1, 10),
            ("read", 1, 2**63, 10),
            ("read", 1, -1, 10),
            ("read", 1, 0, -5),
            ("read", 1, 0, 2**70),
            ("read", 1, "0", 10),
            ("read", 1, None, 10),
            ("read", 1, 0.5, 10),
            ("read", True, 0, 10),
            ("read", [1], 0, 10),
            ("read", 2**64, 0, 10),
            ("write", 1, 2**64 - 1),
            ("open", "/leak/file", 2**64, 0),
            ("open", "/leak/file", 0, -1),
            ("open", 7, 0, 0),
            ("open", "/leak/fi\x00le", 0, 0),
            ("stat", {"a": 1}),
            ("listdir", "/" * 70000),
            ("setstat", "/leak/file", {"mode": 2**80, "atime": 2**80, "mtime": -(2**80)}),
            ("setstat", "/leak/file", {"size": -1}),
            ("setstat", "/leak/file", []),
            ("fsetstat", 1, {"atime": "x", "mtime": 1}),
            ("rename", "/leak/file", "/leak/file2", "yes"),
            ("mkdir", "/leak/d", 2**90),
        ]
        for op, *args in absurd:
            got, data = helper.call(op, *args)
            if got is None:
                helper.end()
                assert _markers(pid) == [], f"the helper died on {op} {args} and ran the planted code"
                raise AssertionError(f"the helper died on {op} {args}")
            assert isinstance(got.get("errno"), int) and got["errno"] > 0 and data == b"", (op, args, got)
        for request in (
            b"{not json",
            b"[1, 2]",
            b'"op"',
            b"{}",
            b'{"op": "read", "args": {"a": 1}}',
            b'{"op": "__init__", "args": []}',
            b'{"op": "_fd", "args": [1]}',
            b"\xff\xfe",
            b"[" * 5000 + b"]" * 5000,
            b'{"op": "read", "args": [1, 1e400, 1]}',
        ):
            got, _ = helper.raw(request)
            assert got is not None and got.get("errno"), (request[:40], got)
        got, data = helper.call("read", 1, 0, 100)  # still serving, and still the container's file
        assert got == {"ok": len(data)} and data == b"container file\n"
    finally:
        stderr = helper.end()
    assert stderr == b"", stderr.decode(errors="replace")[-2000:]  # no traceback, nothing printed
    assert _markers(pid) == []  # no planted module or codec ran


def test_no_path_reaches_a_host_file_or_opens_a_device(hostile):
    container, pid, secret, _image = hostile
    helper = Helper(pid, container)
    try:
        assert helper.answer()[0] == {"ok": "/root"}
        escapes = [
            "/leak/host",
            "/leak/up",
            "/leak/proc",
            "/leak/self",
            "/leak/cwd",
            "/data/host",
            "/data/up",
            str(secret),
            "../" * 12 + str(secret).lstrip("/"),
            f"/proc/1/root{secret}",
            f"/proc/self/root{secret}",
            f"/data/../../../../{secret}",
        ]
        for path in escapes:
            got, data = helper.call("open", path, os.O_RDONLY, 0)
            if "ok" in got:
                got, data = helper.call("read", got["ok"], 0, 1000)
            assert secret.read_bytes() not in data and "errno" in got, (path, got, data)
            got, _ = helper.call("stat", path)
            assert "errno" in got, (path, got)
        for path in ("/leak/host", "/data/up"):  # writing through a dangling link creates nothing on the host
            got, _ = helper.call("open", path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            assert "errno" in got, (path, got)
        assert secret.read_text().startswith("HOST SECRET")
        for path in ("/leak/zero", "/leak/mem", "/leak/fifo", "/dev/null", "/dev/zero"):
            got, _ = helper.call("open", path, os.O_RDONLY, 0)
            assert got.get("errno") == errno.EACCES, (path, got)
            got, _ = helper.call("open", path, os.O_WRONLY, 0)
            assert got.get("errno") == errno.EACCES, (path, got)
        for path in ("/proc/self/status", "/proc/1/environ", "/sys/kernel/uevent_helper", "/proc/sys/kernel/hostname"):
            got, _ = helper.call("open", path, os.O_RDONLY, 0)
            assert "errno" in got, (path, got)  # the kernel's files answer for the host's namespaces: never opened
        for op, args in (("mkdir", ["/sys/fs/cgroup/pids/x", 0o755]), ("remove", ["/proc/1/environ"])):
            assert helper.call(op, *args)[0].get("errno") in (errno.EACCES, errno.ENOENT), op
        # a link made through the helper itself, and renames that try to climb out, stay inside
        assert helper.call("symlink", str(secret), "/data/made")[0] == {"ok": None}
        got, _ = helper.call("open", "/data/made", os.O_RDONLY, 0)
        assert got.get("errno") == errno.ENOENT
        assert helper.call("mkdir", "/data/../../../../made-dir", 0o755)[0] == {"ok": None}
        assert os.path.isdir(f"/proc/{pid}/root/made-dir") and not os.path.exists("/made-dir")
        assert "errno" in helper.call("rename", "/data/made", "/data/../..")[0]
        assert helper.call("realpath", "/../../..")[0] == {"ok": "/"}
        assert helper.call("realpath", "/leak/up")[0] == {"ok": "/leak/up"}  # its target is not there: itself
        names = [name for name, _ in helper.call("listdir", "/leak")[0]["ok"]]
        assert sorted(names) == ["cwd", "fifo", "file", "host", "mem", "proc", "rootonly", "self", "up", "zero"]
    finally:
        stderr = helper.end()
    assert stderr == b"" and _markers(pid) == []


def test_a_process_that_is_not_the_containers_is_refused(hostile):
    container, pid, _secret, _image = hostile
    other = "0123456789abcdef" * 4
    for asked_pid, asked_id in ((pid, other), (os.getpid(), container), (pid, container[:12])):
        helper = Helper(asked_pid, asked_id)
        got, _ = helper.answer()
        helper.end()
        assert got is not None and got.get("errno") == errno.EPERM, (asked_pid, asked_id, got)
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process (or, recycled, another one)
    helper = Helper(gone.pid, container)
    got, _ = helper.answer()
    helper.end()
    assert got is not None and got.get("errno") == errno.EPERM, got
    for asked_id in (container, ""):  # the right pair is served; without an id (older callers), a container's pid
        helper = Helper(pid, asked_id)
        assert helper.answer()[0] == {"ok": "/root"}
        assert helper.end() == b""


def _status(pid: int) -> dict[str, str]:
    lines = open(f"/proc/{pid}/status").read().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def test_the_helper_is_the_containers_user_in_its_cgroups(hostile):
    container, pid, _secret, _image = hostile
    helper = Helper(pid, container, "renter")
    try:
        assert helper.answer()[0] == {"ok": "/home/renter"}
        status = _status(helper.process.pid)
        assert status["Uid"].split()[:2] == ["1000", "1000"] and status["Groups"].split() == ["1000", "2000"]
        assert int(status["CapEff"], 16) == 0 and status["NoNewPrivs"] == "1"
        assert container in open(f"/proc/{helper.process.pid}/cgroup").read()
        got, _ = helper.call("open", "/leak/file", os.O_RDONLY, 0)
        assert got == {"ok": 1}
        assert helper.call("open", "/leak/rootonly", os.O_RDONLY, 0)[0].get("errno") == errno.EACCES
        assert helper.call("open", "/leak/new", os.O_WRONLY | os.O_CREAT, 0o644)[0].get("errno") == errno.EACCES
        got, _ = helper.call("open", "made", os.O_WRONLY | os.O_CREAT, 0o600)  # relative: in the home
        assert "ok" in got, got
        assert helper.call("write", got["ok"], 0) == ({"ok": 0}, b"")
        made = os.stat(f"/proc/{pid}/root/home/renter/made")
        assert (made.st_uid, made.st_gid) == (1000, 1000)
    finally:
        assert helper.end() == b""
    helper = Helper(pid, container)
    try:
        assert helper.answer()[0] == {"ok": "/root"}
        status = _status(helper.process.pid)
        assert status["Uid"].split()[0] == "0" and int(status["CapEff"], 16) & ~0x1F == 0  # file capabilities only
        assert int(status["CapBnd"], 16) & ~0x1F == 0 and status["NoNewPrivs"] == "1"
    finally:
        assert helper.end() == b""


def _planting_script() -> str:
    """The shell commands that plant the sentinels from inside a busybox container."""
    lines = []
    for path in PLANTED:
        lines.append(f"mkdir -p {os.path.dirname(path)} && printf '%s' '{SENTINEL}' > {path}")
    for path in AGENT_SOURCES:
        lines.append(f"mkdir -p {os.path.dirname(path)} && printf '# coding: pwnedcodec\\n%s' '{SENTINEL}' > {path}")
    lines.append("echo container-file > /file && exec sleep 100000")
    return " && ".join(lines)


async def test_an_sftp_client_at_absurd_offsets_through_the_agents_ssh(local_market, tmp_path):
    renter, _parts, _local = local_market
    key = await registered_key(renter, tmp_path / "renter")
    command = json.dumps(["sh", "-c", _planting_script()])
    content = f"services:\n  shell:\n    image: {TEST_IMAGE}\n    command: {command}\n    stop_grace_period: 1s\n"
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, content, name="files", isSSHEnabled=True)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    tunnels = await renter.tunnels(rental_id, stack_id, 1, ssh_ready)
    info = tunnels[0]["ssh"]
    end = await asyncio.to_thread(Endpoint, info["host"], info["port"], info["hostKey"], tmp_path)
    user = info["user"]
    async with (
        asyncssh.connect(
            info["host"], port=info["port"], username=user, client_keys=[str(key)], known_hosts=str(end.known_hosts)
        ) as connection,
        connection.start_sftp_client() as sftp,
    ):
        async with sftp.open("/file", "rb") as remote:
            for offset in (2**64 - 1, 2**63):
                with pytest.raises(asyncssh.SFTPError):
                    await remote.read(10, offset)
            assert await remote.read(100, 0) == b"container-file\n"  # the same helper serves on
        for attrs in (asyncssh.SFTPAttrs(uid=2**32 - 1, gid=2**32 - 1), asyncssh.SFTPAttrs(size=2**64 - 1)):
            with pytest.raises(asyncssh.SFTPError):
                await sftp.setstat("/file", attrs)
        assert await sftp.stat("/file")
    done = await asyncio.to_thread(end.sftp, key, user, f"get /file {tmp_path / 'got'}\nls /\n")
    got = await asyncio.to_thread((tmp_path / "got").read_bytes)
    assert done.returncode == 0 and got == b"container-file\n", done
    assert b"pwned" not in done.stdout, done.stdout  # no planted module or codec ran

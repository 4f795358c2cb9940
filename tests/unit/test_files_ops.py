"""The file helper's operations (runtime/files_ops.py) on a plain directory as
the root: what SFTP gets from them, and that no path, link or `..` leaves the
root. Confinement to a real container is tested end to end
(integration/test_files_escape_engine.py, integration/test_ssh.py)."""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
from pathlib import Path

import pytest

from gpuhost_agent.runtime.container_files import ContainerFiles
from gpuhost_agent.runtime.files_ops import FRAME, MAX_DATA, MAX_JSON, Files, serve, write_frame
from gpuhost_agent.runtime.files_paths import Root


def _files(root: Path) -> Files:
    return Files(Root(os.open(root, os.O_PATH | os.O_DIRECTORY)))


def test_only_regular_files_open_and_reads_are_capped(tmp_path: Path) -> None:
    files = _files(tmp_path)
    (tmp_path / "big").write_bytes(b"x" * (MAX_DATA + 10))
    handle = files.open("/big", os.O_RDONLY, 0)
    assert len(files.read(handle, 0, 10 * MAX_DATA)) == MAX_DATA
    files.close(handle)
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would block a helper without the O_PATH check
    os.symlink("/dev/null", tmp_path / "null")  # resolved in the root: no such file there
    for path in ("/fifo", "/", "/null"):
        with pytest.raises(OSError) as refused:
            files.open(path, os.O_RDONLY, 0)
        assert refused.value.errno in (errno.EACCES, errno.EISDIR, errno.ENOENT), path
    assert files.handles == {}


def test_paths_links_and_dotdot_stay_under_the_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.write_text("host secret")
    (root / "inside").write_text("inside")
    os.symlink(str(outside), root / "absolute")
    os.symlink("../outside", root / "relative")
    os.symlink("/inside", root / "good")
    files = _files(root)
    for path in ("/absolute", "/relative", "../outside", "/../outside", str(outside)):
        with pytest.raises(FileNotFoundError):
            files.open(path, os.O_RDONLY, 0)
    with pytest.raises(FileExistsError):  # creating through a dangling link makes nothing outside
        files.open("/absolute", os.O_WRONLY | os.O_CREAT, 0o644)
    assert outside.read_text() == "host secret"
    handle = files.open("/good", os.O_RDONLY, 0)
    assert files.read(handle, 0, 100) == b"inside"
    assert files.realpath("/../../good") == "/inside" and files.realpath("/") == "/"
    assert files.realpath("/new-name") == "/new-name"
    files.mkdir("/../../made", 0o755)
    assert (root / "made").is_dir() and not (tmp_path / "made").exists()
    files.symlink(str(outside), "/made/link")
    assert files.readlink("/made/link") == str(outside)
    with pytest.raises(FileNotFoundError):
        files.stat("/made/link")
    assert files.lstat("/made/link")[0] & 0o170000 == 0o120000
    for op, args in (("rmdir", ["/.."]), ("remove", ["/"]), ("rename", ["/inside", "/made/.."])):
        with pytest.raises(OSError) as refused:
            getattr(files, op)(*args)
        assert refused.value.errno == errno.EINVAL, op


def test_rename_keeps_an_existing_target_unless_asked_to_replace(tmp_path: Path) -> None:
    files = _files(tmp_path)
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    with pytest.raises(OSError) as kept:
        files.rename("/a", "/b")  # SFTPv3 rename
    assert kept.value.errno == errno.EEXIST and (tmp_path / "b").read_text() == "b"
    files.rename("/a", "/b", True)  # posix-rename@openssh.com
    assert (tmp_path / "b").read_text() == "a" and not (tmp_path / "a").exists()


def _exchange(files: Files, frames: list[tuple[bytes, bytes]]) -> list[tuple[dict, bytes]]:
    requests = io.BytesIO()
    for request, data in frames:
        requests.write(FRAME.pack(len(request), len(data)) + request + data)
    requests.seek(0)
    answers = io.BytesIO()
    serve(requests, answers, files)
    answers.seek(0)
    got = []
    while head := answers.read(FRAME.size):
        json_length, data_length = FRAME.unpack(head)
        got.append((json.loads(answers.read(json_length)), answers.read(data_length)))
    return got


def _request(op: str, *args: object) -> tuple[bytes, bytes]:
    return json.dumps({"op": op, "args": list(args)}).encode(), b""


def test_requests_and_answers_over_the_frames(tmp_path: Path) -> None:
    """What the agent sends, what the helper answers: errors as errno, reads as data."""
    (tmp_path / "f").write_bytes(b"hello")
    got = _exchange(
        _files(tmp_path),
        [
            _request("open", "/f", os.O_RDONLY, 0),
            _request("read", 1, 0, 100),
            _request("stat", "/missing"),
            _request("__init__"),
        ],
    )
    assert got[0] == ({"ok": 1}, b"")
    assert got[1] == ({"ok": 5}, b"hello")
    assert got[2][0]["errno"] == errno.ENOENT
    assert got[3][0]["errno"] == errno.ENOSYS  # only the operations SFTP needs


def test_every_absurd_request_is_answered_and_the_helper_serves_on(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"hello")
    absurd = [
        _request("read", 1, 2**64 - 1, 10),  # an OverflowError in os.pread, uncaught before
        _request("read", 1, -1, 10),
        _request("read", 1, 0, 2**80),
        _request("read", 1, "0", 10),
        _request("read", True, 0, 10),
        _request("open", "/f", 2**64, 0),
        _request("open", ["/f"], 0, 0),
        _request("setstat", "/f", {"atime": 2**70, "mtime": 1}),
        _request("setstat", "/f", {"size": -1}),
        _request("rename", "/f", "/g", "yes"),
        _request("symlink", "x\x00y", "/l"),
        (b"{not json", b""),
        (b"\xff\xfe{\x00}\x00", b""),
        (b"[" * 100_00 + b"]" * 100_00, b""),
        (b"[1]", b""),
        (b'{"op": "read", "args": "1"}', b""),
        (b"x" * (MAX_JSON + 1), b""),
    ]
    frames = [_request("open", "/f", os.O_RDONLY, 0), *absurd, _request("read", 1, 1, 100)]
    got = _exchange(_files(tmp_path), frames)
    assert len(got) == len(frames)
    for (answer, data), frame in zip(got[1:-1], absurd, strict=True):
        assert isinstance(answer.get("errno"), int) and answer["errno"] > 0 and data == b"", (frame[0][:60], answer)
    assert got[-1] == ({"ok": 4}, b"ello")
    assert (tmp_path / "f").read_bytes() == b"hello"


def test_write_frame_is_what_the_agent_reads() -> None:
    sink = io.BytesIO()
    write_frame(sink, {"ok": 3}, b"abc")
    assert sink.getvalue() == FRAME.pack(9, 3) + b'{"ok": 3}abc'


def _big_listing(root: Path) -> bytes:
    for index in range(3000):
        (root / f"file-{index:05d}-{'x' * 40}").touch()
    request = json.dumps({"op": "listdir", "args": ["/"]}).encode()
    answers = io.BytesIO()
    serve(io.BytesIO(FRAME.pack(len(request), 0) + request), answers, _files(root))
    return answers.getvalue()


async def test_a_big_directory_is_listed_in_one_answer_the_agent_reads(tmp_path: Path) -> None:
    """3000 names (about 300 KB of JSON): before, the agent refused any answer over
    64 KiB, so a directory of more than ~600 entries ended the SFTP session."""
    reader = asyncio.StreamReader()
    reader.feed_data(await asyncio.to_thread(_big_listing, tmp_path))
    reader.feed_eof()
    files = ContainerFiles(reader, None, None)  # type: ignore[arg-type]
    entries, _ = await files._answer()
    assert len(entries) == 3000

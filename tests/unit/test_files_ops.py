"""The file helper's operations (runtime/files_ops.py) on a plain directory:
what SFTP gets from them once the helper is inside a container. Confinement
itself needs a container and is tested end to end (integration/test_ssh.py)."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest

from gpuhost_agent.runtime.files_ops import FRAME, MAX_DATA, Files, serve, write_frame


def test_only_regular_files_open_and_reads_are_capped(tmp_path: Path) -> None:
    files = Files()
    big = tmp_path / "big"
    big.write_bytes(b"x" * (MAX_DATA + 10))
    handle = files.open(str(big), os.O_RDONLY, 0)
    assert len(files.read(handle, 0, 10 * MAX_DATA)) == MAX_DATA
    files.close(handle)
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would block a helper without O_NONBLOCK
    for path in (tmp_path / "fifo", Path("/dev/null"), tmp_path):
        with pytest.raises(OSError) as refused:
            files.open(str(path), os.O_RDONLY, 0)
        assert refused.value.errno in (errno.EACCES, errno.EISDIR), path
    assert files.handles == {}


def test_rename_keeps_an_existing_target_unless_asked_to_replace(tmp_path: Path) -> None:
    files = Files()
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    with pytest.raises(OSError) as kept:
        files.rename(str(tmp_path / "a"), str(tmp_path / "b"))  # SFTPv3 rename
    assert kept.value.errno == errno.EEXIST and (tmp_path / "b").read_text() == "b"
    files.rename(str(tmp_path / "a"), str(tmp_path / "b"), True)  # posix-rename@openssh.com
    assert (tmp_path / "b").read_text() == "a" and not (tmp_path / "a").exists()


def test_requests_and_answers_over_the_frames(tmp_path: Path) -> None:
    """What the agent sends, what the helper answers: errors as errno, reads as data."""
    (tmp_path / "f").write_bytes(b"hello")
    requests = io.BytesIO()
    for message, data in (
        ({"op": "open", "args": [str(tmp_path / "f"), os.O_RDONLY, 0]}, b""),
        ({"op": "read", "args": [1, 0, 100]}, b""),
        ({"op": "stat", "args": [str(tmp_path / "missing")]}, b""),
        ({"op": "__init__", "args": []}, b""),
    ):
        write_frame(requests, message, data)
    requests.seek(0)
    answers = io.BytesIO()
    serve(requests, answers)
    answers.seek(0)
    got = []
    while head := answers.read(FRAME.size):
        json_length, data_length = FRAME.unpack(head)
        got.append((json.loads(answers.read(json_length)), answers.read(data_length)))
    assert got[0] == ({"ok": 1}, b"")
    assert got[1] == ({"ok": 5}, b"hello")
    assert got[2][0]["errno"] == errno.ENOENT
    assert got[3][0]["errno"] == errno.ENOSYS  # only the operations SFTP needs

"""The agent's log framing and channel requests, without an engine (pure)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.renter_streams import Demux

from gpuhost_agent.streams import frames
from gpuhost_agent.streams.requests import (
    CancelRequest,
    LogsRequest,
    Refusal,
    TerminalRequest,
    parse_request,
    parse_resize,
)

T1 = b"2024-05-09T07:35:25.000000001Z"
T2 = b"2024-05-09T07:35:25.000000002Z"
T3 = b"2024-05-09T07:35:26.500000000Z"


def engine_frame(stream: int, stamp: bytes, text: bytes) -> bytes:
    payload = stamp + b" " + text
    return bytes([stream, 0, 0, 0]) + struct.pack(">I", len(payload)) + payload


def run(parser, data: bytes, cuts: list[int]) -> Demux:
    """Feed `data` cut at `cuts`, read the result with the independent demultiplexer."""
    demux = Demux()
    pieces, last = [], 0
    for cut in sorted(set(c for c in cuts if 0 < c < len(data))) + [len(data)]:
        pieces.append(data[last:cut])
        last = cut
    for piece in pieces:
        batch = parser.feed(piece)
        if batch is not None:
            demux.feed(batch.data)
            assert batch.payload_bytes == len(batch.data) - 8 * batch.frames
    batch = parser.flush()
    if batch is not None:
        demux.feed(batch.data)
    assert demux.leftover == 0
    return demux


STREAM = engine_frame(1, T1, b"one\n") + engine_frame(2, T2, b"two words\n") + engine_frame(1, T3, b"three\n")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(STREAM)), max_size=12), st.booleans())
def test_frames_survive_any_chunking(cuts, keep):
    demux = run(frames.FrameParser(keep), STREAM, cuts)
    prefix = (lambda t: t.decode() + " ") if keep else (lambda t: "")
    assert demux.frames == [
        (1, (prefix(T1) + "one\n").encode()),
        (2, (prefix(T2) + "two words\n").encode()),
        (1, (prefix(T3) + "three\n").encode()),
    ]


def test_last_timestamp_and_resume_skip_what_was_sent():
    parser = frames.FrameParser(False)
    parser.feed(engine_frame(1, T1, b"one\n") + engine_frame(1, T2, b"two\n"))
    assert parser.last_timestamp == T2
    assert parser.resume() == "1715240125.000000002"
    # The engine's since includes T2 itself: it comes again and is skipped.
    batch = parser.feed(engine_frame(1, T1, b"one\n") + engine_frame(1, T2, b"two\n") + engine_frame(1, T3, b"3\n"))
    assert Demux().feed(batch.data) == [(1, b"3\n")] and batch.frames == 1
    # The same moment again on stdout is the same line sent again; on stderr it is new.
    assert parser.feed(engine_frame(1, T3, b"3\n")) is None
    batch = parser.feed(engine_frame(2, T3, b"err at that moment\n"))
    assert batch is not None and batch.frames == 1


@pytest.mark.parametrize("keep", [True, False])
def test_lines_a_rotation_sends_again_are_skipped_wherever_they_fall(keep):
    """Docker 20.10's follow sends lines of a rotated file again, from the
    middle of a chunk; stderr's lines are judged against stderr's own."""
    stamps = [b"2024-05-09T07:35:25.%09dZ" % n for n in range(1, 7)]
    parser = frames.FrameParser(keep)
    first = b"".join(engine_frame(1, stamps[n], b"%d\n" % n) for n in range(4))
    again = b"".join(engine_frame(1, stamps[n], b"%d\n" % n) for n in (2, 3))
    late_err = engine_frame(2, stamps[0], b"err\n")  # older than stdout's newest: still new
    rest = b"".join(engine_frame(1, stamps[n], b"%d\n" % n) for n in (4, 5))
    got = Demux()
    for chunk in (first, again + late_err + rest[:5], rest[5:]):
        batch = parser.feed(chunk)
        if batch is not None:
            got.feed(batch.data)
    assert got.lines(1) == [(stamps[n].decode() + " " if keep else "") + str(n) for n in range(6)]
    assert got.lines(2) == [(stamps[0].decode() + " " if keep else "") + "err"]


def test_resume_after_a_given_moment_when_nothing_was_sent():
    parser = frames.RawParser(True)
    assert parser.resume(after=T2) == "1715240125.000000002"
    batch = parser.feed(T1 + b" old\r\n" + T3 + b" new\r\n")
    assert Demux().feed(batch.data) == [(1, T3 + b" new\r\n")]


def test_tty_lines_become_stdout_frames_and_partial_lines_wait():
    parser = frames.RawParser(False)
    assert parser.feed(T1 + b" hel") is None
    batch = parser.feed(b"lo\r\n" + T2 + b" sec")
    assert Demux().feed(batch.data) == [(1, b"hello\r\n")]
    assert Demux().feed(parser.flush().data) == [(1, b"sec")]
    assert parser.last_timestamp == T2


def test_engine_error_frame_and_garbage_are_refused():
    import pytest

    with pytest.raises(frames.LogFormatError, match="engine reported: boom"):
        frames.FrameParser(True).feed(bytes([3, 0, 0, 0, 0, 0, 0, 4]) + b"boom")
    with pytest.raises(frames.LogFormatError, match="not a multiplexed"):
        frames.FrameParser(True).feed(b"plain text, not frames")


def test_agent_messages_and_timestamps():
    assert Demux().feed(frames.dropped_frame(3, 120)) == [
        (3, b"gpuhost: 3 log lines (120 bytes) dropped: the reader fell behind\n")
    ]
    assert Demux().feed(frames.exited_frame(137)) == [
        (3, b"gpuhost: container exited with code 137; following on when it starts again\n")
    ]
    assert frames.timestamp_key(b"2024-05-09T09:35:26.5+02:00") == T3
    assert frames.timestamp_seconds(b"2024-05-09T07:35:25Z") == (1715240125, 0)


# ---- channel requests ----------------------------------------------------------------
BASE = {"streamId": "s-1", "rentalId": "r1", "stackId": "k1", "containerId": "c1"}


def test_logs_and_terminal_requests_with_defaults():
    assert parse_request({"type": "logs", **BASE}) == LogsRequest("s-1", "r1", "k1", "c1")
    assert parse_request(
        {"type": "logs", **BASE, "tail": 0, "since": 5, "timestamps": True, "follow": True}
    ) == LogsRequest("s-1", "r1", "k1", "c1", 0, 5, True, True)
    assert parse_request({"type": "terminal", **BASE, "containerId": "/web-1"}) == TerminalRequest(
        "s-1", "r1", "k1", "web-1", ("/bin/sh",), 80, 24
    )
    assert parse_request({"type": "terminal", **BASE, "command": ["bash", "-l"], "cols": 1000, "rows": 1}).command == (
        "bash",
        "-l",
    )
    assert parse_request({"type": "cancel", "streamId": "x"}) == CancelRequest("x")


def test_bad_requests_are_refused_with_400_or_ignored():
    bad = [
        {"tail": -1},
        {"tail": True},
        {"since": "yesterday"},
        {"follow": "yes"},
        {"containerId": "../etc"},
        {"rentalId": ""},
        {"type": "terminal", "cols": 0},
        {"type": "terminal", "rows": 1001},
        {"type": "terminal", "command": []},
        {"type": "terminal", "command": ["x"] * 65},
        {"type": "terminal", "command": ["x" * 4097]},
        {"type": "terminal", "command": "sh"},
        {"type": "launch"},
    ]
    for change in bad:
        refusal = parse_request({"type": "logs", **BASE, **change})
        assert isinstance(refusal, Refusal) and refusal.status == 400 and refusal.stream_id == "s-1", change
    for stream_id in (None, "", "a" * 65, "a/b", 7):
        assert parse_request({"type": "logs", **BASE, "streamId": stream_id}) == Refusal(None, 400, refusal_text())
    assert parse_request([1]).stream_id is None


def refusal_text() -> str:
    return parse_request({"type": "logs"}).error


def test_resize_messages():
    assert parse_resize({"type": "resize", "cols": 120, "rows": 40}) == (120, 40)
    for bad in (
        {"type": "resize", "cols": 0, "rows": 4},
        {"type": "resize", "cols": 5},
        {"type": "x"},
        [],
        {"type": "resize", "cols": 1001, "rows": 4},
        {"type": "resize", "cols": True, "rows": 4},
    ):
        assert parse_resize(bad) is None


def test_a_large_frame_in_many_chunks():
    big = engine_frame(1, T1, b"x" * 300_000 + b"\n") + engine_frame(2, T2, b"after\n")
    demux = run(frames.FrameParser(False), big, list(range(0, len(big), 1000)))
    assert demux.frames == [(1, b"x" * 300_000 + b"\n"), (2, b"after\n")]


def test_docker_host_addresses():
    import pytest

    from gpuhost_agent.runtime.engine.client import EngineError
    from gpuhost_agent.runtime.engine.streams import parse_docker_host

    assert parse_docker_host(None).unix_path == "/var/run/docker.sock"
    assert parse_docker_host("unix:///run/user/1000/docker.sock").unix_path == "/run/user/1000/docker.sock"
    assert parse_docker_host("tcp://10.0.0.5:2376").base_url == "http://10.0.0.5:2376"
    assert parse_docker_host("tcp://engine").base_url == "http://engine:2375"
    for bad in ("ssh://me@host", "npipe:////./pipe/docker_engine", "unix://relative.sock", "tcp://:x"):
        with pytest.raises(EngineError, match="DOCKER_HOST"):
            parse_docker_host(bad)
    with pytest.raises(EngineError, match="TLS"):
        parse_docker_host("tcp://engine:2376", tls=True)

"""Docker's multiplexed log format, read and written incrementally (pure).

The agent always asks the engine for timestamps, whatever the renter asked:
they are how it knows where it is, so that a follow resumed after a container
restart skips what was already sent. They are cut off again here when the
renter did not ask for them.

Parsing works on whole engine chunks (64 KiB), not lines: a chunk goes out as
one Batch of whole frames, and when the renter wants timestamps and nothing is
skipped the Batch is a slice of the chunk, with no per-frame copy. The only
per-frame work is reading the 8-byte header and comparing the timestamp with
the newest of its stream (a line sent again is skipped), so the pump keeps up
with the engine (see docs/streams.md, "Logs").
"""

from __future__ import annotations

import calendar
import re
import struct
import time
from dataclasses import dataclass

from gpuhost_agent.errors import Refusal

STDOUT, STDERR, AGENT = 1, 2, 3
HEADER_BYTES = 8
_HEADER = struct.Struct(">LL")  # stream in the top byte of the first word, then the length
_STDOUT_WORD, _STDERR_WORD = STDOUT << 24, STDERR << 24
_SYSTEM_ERROR_WORD = 3 << 24  # the engine's own error frame ("systemerr")
# "2024-05-09T07:35:25.123456789Z" is 30 characters; one with an offset 35.
_TIMESTAMP_SEARCH = 40
_FIXED_LENGTH = 30
_RFC3339 = re.compile(rb"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")
# A TTY log line longer than this without a newline goes out as it is.
MAX_RAW_LINE = 1024 * 1024
# The engine splits log lines at 16 KiB (json-file) or 1 MiB (local): a longer
# frame is a broken stream, not a line to buffer.
MAX_FRAME = 8 * 1024 * 1024


class LogFormatError(Refusal, ValueError):
    """The engine's stream is not what it should be (or carries an engine error)."""


def frame(stream: int, payload: bytes) -> bytes:
    return _HEADER.pack(stream << 24, len(payload)) + payload


def agent_frame(text: str) -> bytes:
    """A stream-3 frame: the agent's own words, placed where they happened,
    one line like every other frame, so a reader that prints them stays tidy."""
    return frame(AGENT, ("gpuhost: " + text + "\n").encode())


def dropped_frame(lines: int, nbytes: int) -> bytes:
    return agent_frame(f"{lines} log lines ({nbytes} bytes) dropped: the reader fell behind")


def exited_frame(code: object) -> bytes:
    return agent_frame(f"container exited with code {code}; following on when it starts again")


def stopped_frame(code: object) -> bytes:
    """The last line of a follow whose container stopped with no restart coming."""
    return agent_frame(f"container exited with code {code}")


def timestamp_key(stamp: bytes) -> bytes:
    """A form of an RFC 3339 timestamp that sorts by time as bytes. Docker's
    own (UTC, nine digits) is already one; anything else is rewritten."""
    if len(stamp) == _FIXED_LENGTH and stamp[-1:] == b"Z":
        return stamp
    seconds, nanos = timestamp_seconds(stamp)
    year, month, day, hour, minute, second = _gmtime(seconds)
    return b"%04d-%02d-%02dT%02d:%02d:%02d.%09dZ" % (year, month, day, hour, minute, second, nanos)


def timestamp_seconds(stamp: bytes) -> tuple[int, int]:
    """(Unix seconds, nanoseconds) of an RFC 3339 timestamp; ValueError if it is none."""
    match = _RFC3339.match(stamp)
    if not match:
        raise ValueError(f"not an RFC 3339 timestamp: {stamp[:40]!r}")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    nanos = int((match.group(7) or b"0").ljust(9, b"0"))
    seconds = calendar.timegm((year, month, day, hour, minute, second))
    zone = match.group(8)
    if zone != b"Z":
        offset = int(zone[1:3]) * 3600 + int(zone[4:6]) * 60
        seconds -= offset if zone[:1] == b"+" else -offset
    return seconds, nanos


def since_param(stamp: bytes) -> str:
    """The engine's `since` for "from this timestamp on" (it includes the moment itself)."""
    seconds, nanos = timestamp_seconds(stamp)
    return f"{seconds}.{nanos:09d}"


def _gmtime(seconds: int) -> tuple[int, ...]:
    return tuple(time.gmtime(seconds))[:6]


@dataclass(slots=True)
class Batch:
    data: bytes  # whole frames, ready to send
    frames: int  # log lines, for the drop message
    payload_bytes: int  # what the renter would have read, headers not counted


class _Parser:
    """What both formats share: per stream, the timestamp of the newest line
    handed out, and no line at or before it is handed out again. That is the
    skip on resume (the engine's `since` includes its own moment), and it is
    also what Docker 20.10's follow needs across a log rotation: it sends
    lines of the rotated file again (seen on this machine's dockerd with a
    64 KiB max-size, and reported for years: moby/moby#37646, #39235).
    Docker stamps each line on its own (nanoseconds, in order per stream),
    so a timestamp not after the newest of its stream is a line already sent."""

    def __init__(self, keep_timestamps: bool):
        self.keep_timestamps = keep_timestamps
        self._newest: dict[int, bytes] = {STDOUT: b"", STDERR: b""}  # sortable keys (timestamp_key)
        self._pending = b""

    @property
    def last_timestamp(self) -> bytes | None:
        """The newest line handed out, of either stream."""
        return max(self._newest.values()) or None

    def resume(self, after: bytes | None = None) -> str | None:
        """A new engine read starts: returns the engine's `since` to read from
        the newest line handed out (or from `after`, a timestamp, when none
        was), None to read as before."""
        if after and self.last_timestamp is None:
            key = _key(after)
            if key:
                self._newest = {STDOUT: key, STDERR: key}
        self._pending = b""
        mark = self.last_timestamp
        return since_param(mark) if mark else None

    def _is_new(self, stream: int, stamp: bytes) -> bool:
        """Whether the line is after the newest of its stream (and then it is the newest)."""
        key = stamp if len(stamp) == _FIXED_LENGTH and stamp[-1] == 90 else _key(stamp)  # 90: "Z"
        if not key:
            return True  # no timestamp to judge by: handed out
        if key <= self._newest[stream]:
            return False
        self._newest[stream] = key
        return True


def _key(stamp: bytes) -> bytes:
    try:
        return timestamp_key(stamp)
    except ValueError:
        return b""


class FrameParser(_Parser):
    """The multiplexed stream of a container without a TTY."""

    def __init__(self, keep_timestamps: bool):
        super().__init__(keep_timestamps)
        self._parts: list[bytes] = []  # a frame still arriving, when it is large
        self._have = 0
        self._need = 0

    def feed(self, chunk: bytes) -> Batch | None:
        if self._parts:  # joined once it is whole, not once per chunk
            self._parts.append(chunk)
            self._have += len(chunk)
            if self._have < self._need:
                return None
            chunk, self._parts = b"".join(self._parts), []
        data = self._pending + chunk if self._pending else chunk
        size = len(data)
        pos = start = frames = 0
        unpack = _HEADER.unpack_from
        out: list[bytes] | None = None if self.keep_timestamps else []
        kept: list[bytes] = []  # with timestamps: the runs of frames before a skipped one
        pack = _HEADER.pack
        find = data.find
        is_new = self._is_new
        while size - pos >= HEADER_BYTES:
            word, length = unpack(data, pos)
            end = pos + HEADER_BYTES + length
            if word != _STDOUT_WORD and word != _STDERR_WORD or length > MAX_FRAME:
                self._bad_frame(word, length, data[pos + HEADER_BYTES : end])
            if end > size:
                break
            space = find(b" ", pos + HEADER_BYTES, min(end, pos + HEADER_BYTES + _TIMESTAMP_SEARCH))
            if space > 0 and not is_new(STDOUT if word == _STDOUT_WORD else STDERR, data[pos + HEADER_BYTES : space]):
                if out is None and start < pos:
                    kept.append(data[start:pos])
                pos = start = end
                continue
            if out is not None:
                if space < 0:
                    out.append(data[pos:end])
                else:
                    out.append(pack(word, end - space - 1))
                    out.append(data[space + 1 : end])
            frames += 1
            pos = end
        self._pending = data[pos:] if pos < size else b""
        if len(self._pending) >= HEADER_BYTES:
            self._need = HEADER_BYTES + _HEADER.unpack_from(self._pending)[1]
            if self._need > 4 * len(chunk):
                self._parts, self._have, self._pending = [self._pending], len(self._pending), b""
        if not frames:
            return None
        if out is None:
            body = b"".join([*kept, data[start:pos]]) if kept else data[start:pos]
        else:
            body = b"".join(out)
        return Batch(body, frames, len(body) - HEADER_BYTES * frames)

    def flush(self) -> Batch | None:
        """The end of one engine read. A torn frame there is lost with the read."""
        self._pending, self._parts = b"", []
        return None

    def resume(self, after: bytes | None = None) -> str | None:
        self._parts = []
        return super().resume(after)

    @staticmethod
    def _bad_frame(word: int, length: int, payload: bytes) -> None:
        if word == _SYSTEM_ERROR_WORD and length <= MAX_FRAME:
            raise LogFormatError("the engine reported: " + payload.decode("utf-8", "replace")[:500])
        raise LogFormatError(f"not a multiplexed log stream (frame header {word:#010x}, length {length})")


class RawParser(_Parser):
    """A TTY container's log: no frames, one "timestamp line\\n" after another.
    Each line goes out as a stdout frame of its own (one line, one frame, as
    without a TTY), a line still being written stays pending."""

    def feed(self, chunk: bytes) -> Batch | None:
        data = self._pending + chunk if self._pending else chunk
        cut = data.rfind(b"\n") + 1
        if not cut:
            if len(data) <= MAX_RAW_LINE:
                self._pending = data
                return None
            cut = len(data)
        self._pending = data[cut:]
        return self._lines(data[:cut])

    def flush(self) -> Batch | None:
        data, self._pending = self._pending, b""
        return self._lines(data) if data else None

    def _lines(self, data: bytes) -> Batch | None:
        out: list[bytes] = []
        pack = _HEADER.pack
        frames = payload_bytes = 0
        lines = data.split(b"\n")
        ends_with_newline = not lines[-1]
        if ends_with_newline:
            lines.pop()
        for index, line in enumerate(lines):
            space = line.find(b" ", 0, _TIMESTAMP_SEARCH)
            if space > 0:
                if not self._is_new(STDOUT, line[:space]):
                    continue
                if not self.keep_timestamps:
                    line = line[space + 1 :]
            payload = line + b"\n" if ends_with_newline or index < len(lines) - 1 else line
            out.append(pack(_STDOUT_WORD, len(payload)))
            out.append(payload)
            frames += 1
            payload_bytes += len(payload)
        return Batch(b"".join(out), frames, payload_bytes) if frames else None


def parser_for(tty: bool, keep_timestamps: bool) -> FrameParser | RawParser:
    return RawParser(keep_timestamps) if tty else FrameParser(keep_timestamps)

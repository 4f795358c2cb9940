"""Structured logging for operators, with secrets scrubbed before any line is written.

Operators read these lines in the journal; renters' template variables and the
environment's API key must never reach them.  Redaction happens in two places so
that a careless call site cannot leak: keys whose *name* says secret are masked,
and every registered secret *value* is replaced wherever it appears in a string
(a compose error message can echo an interpolated value, for instance).

A renter's values must not rewrite the host's journal either: the log's own
fields (level, event, timestamp, logger) and validated ids are never masked, so
neither a line's priority nor `status`'s last error can be changed by a value
("error", "2026", a rental's own id); only a value that can be a secret is
registered (`might_be_secret`); and a rental's values are masked in its own
lines and in lines that name no rental, not in another rental's.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import structlog

from gpuhost_agent.common import library_logs
from gpuhost_agent.common.visible import visible

MASK = "***"
# Values shorter than this are too common to scrub without mangling every line
# ("1", "true", "web"); they are also too short to be credentials.
MIN_SECRET_LEN = 4
# A value shorter than this ("8000", "admin") is left alone only where it sits
# inside a run of at least ID_RUN lowercase hex digits: a container or image id,
# a digest. There it is a coincidence, not the secret (CI saw a renter's
# PORT=8000 turn a container id 64eb88000af1... into 64eb8***af1... in the status
# answer). Anywhere else, glued to letters or after an escape (`\nHx72q`,
# `%3AHx72q`), it is masked. Longer values are masked
# wherever they appear: 8 given characters sit in a 64-digit id by chance
# with odds below 10^-8.
SHORT_BELOW = 8
ID_RUN = 12
_HEX = frozenset("0123456789abcdef")
_SECRET_KEY_HINTS = ("api_key", "apikey", "secret", "password", "token", "environmentvariables", "env_values")
# A template variable whose name says it holds a credential is a secret however
# short its value; any other value is one from SHORT_BELOW characters on
# (LOG_LEVEL=warning, PORT=8000 and YEAR=2026 are not).
_SECRET_NAME = re.compile(r"secret|key|token|pass|pwd|credential|auth|cert|private|signature", re.IGNORECASE)
# Fields the log writes itself, never masked: a renter's value "error" must not
# change a line's level (its journald priority) nor its event or time. An event
# is the agent's own when it is a snake_case name; a library's message in its
# place is free text, and scrubbed.
OWN_FIELDS = frozenset({"level", "timestamp", "logger"})
_EVENT_NAME = re.compile(r"[a-z][a-z0-9_]{0,79}")
# Ids the agent validated before it logs them (wire_values.SAFE_ID): never masked.
ID_FIELDS = frozenset({"rental_id", "stack_id", "job_id", "env_id", "request_id", "stream_id", "container_id"})
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
EVERY_SCOPE = "*"  # scrub with every rental's values (a line that names no rental, the status answer)


def might_be_secret(name: str, value: str) -> bool:
    """Whether a renter's variable is registered for masking: a name that says
    credential (from MIN_SECRET_LEN characters), or a value of SHORT_BELOW or more."""
    return len(value) >= SHORT_BELOW or (len(value) >= MIN_SECRET_LEN and bool(_SECRET_NAME.search(name)))


class SecretRegistry:
    """The secret strings known to this process (thread-safe), each under a
    scope: None for the host's own (API keys: masked everywhere), a rental's
    id for its renter's values.

    Counted, so that a value two stacks share stays scrubbed until both are
    gone, and a daemon that runs for months does not scan every value any
    stack ever had on each log line.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str | None, Counter[str]] = {}
        # sorted once per change and scope, not per log line
        self._longest_first: dict[str | None, tuple[str, ...]] = {}

    def add(self, *values: str | None, scope: str | None = None) -> None:
        with self._lock:
            counted = self._values.setdefault(scope, Counter())
            for value in values:
                if value and len(value) >= MIN_SECRET_LEN:
                    counted[value] += 1
            self._longest_first.clear()

    def add_many(self, values: Iterable[str], scope: str | None = None) -> None:
        self.add(*values, scope=scope)

    def discard_many(self, values: Iterable[str], scope: str | None = None) -> None:
        with self._lock:
            counted = self._values.get(scope, Counter())
            for value in values:
                if counted.get(value, 0) > 1:
                    counted[value] -= 1
                else:
                    counted.pop(value, None)
            if not counted:
                self._values.pop(scope, None)
            self._longest_first.clear()

    def __contains__(self, value: str) -> bool:
        return any(value in counted for counted in self._values.values())

    def _sorted(self, scope: str | None) -> tuple[str, ...]:
        """The values a line of `scope` is scrubbed of (EVERY_SCOPE: all), longest first."""
        with self._lock:
            found = self._longest_first.get(scope)
            if found is None:
                chosen = (
                    self._values.values()
                    if scope == EVERY_SCOPE
                    else [self._values.get(None, Counter()), self._values.get(scope, Counter())]
                )
                found = tuple(sorted({value for counted in chosen for value in counted}, key=len, reverse=True))
                self._longest_first[scope] = found
            return found

    def scrub(self, text: str, scope: str | None = EVERY_SCOPE) -> str:
        """`text` without the registered values of `scope` (a rental's id: the host's
        and that rental's; EVERY_SCOPE, the default: everyone's)."""
        values = self._sorted(scope)
        for value in values:
            if value not in text:
                continue
            if len(value) >= SHORT_BELOW or not _HEX.issuperset(value):
                text = text.replace(value, MASK)
            else:
                text = _mask_outside_ids(text, value)
        return text


def _mask_outside_ids(text: str, value: str) -> str:
    """`value` (short, hex digits only) masked in `text` wherever it is not
    inside a run of ID_RUN or more lowercase hex digits."""
    out, at = [], 0
    while (found := text.find(value, at)) >= 0:
        start, end = found, found + len(value)
        while start > 0 and text[start - 1] in _HEX:
            start -= 1
        while end < len(text) and text[end] in _HEX:
            end += 1
        if end - start >= ID_RUN:  # an id or a digest: keep the whole run as it is
            out.append(text[at:end])
            at = end
        else:
            out.append(text[at:found] + MASK)
            at = found + len(value)
    out.append(text[at:])
    return "".join(out)


SECRETS = SecretRegistry()


def _is_secret_key(key: str) -> bool:
    folded = key.lower().replace("-", "_")
    return any(hint in folded or hint in folded.replace("_", "") for hint in _SECRET_KEY_HINTS)


def _scrub_value(value: Any, registry: SecretRegistry, scope: str | None = EVERY_SCOPE) -> Any:
    if isinstance(value, str):
        return registry.scrub(value, scope)
    if isinstance(value, dict):
        return {k: (MASK if _is_secret_key(str(k)) else _scrub_value(v, registry, scope)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_scrub_value(v, registry, scope) for v in value)
    if isinstance(value, BaseException):
        return registry.scrub(f"{type(value).__name__}: {value}", scope)
    return value


def _kept(key: str, value: Any) -> bool:
    """A field the redactor leaves as it is: the log's own, or a validated id."""
    if key in OWN_FIELDS:
        return True
    pattern = _EVENT_NAME if key == "event" else _SAFE_ID if key in ID_FIELDS else None
    return pattern is not None and isinstance(value, str) and bool(pattern.fullmatch(value))


def redact_processor(registry: SecretRegistry = SECRETS) -> Callable[..., Any]:
    def processor(_logger: Any, _name: str, event_dict: dict) -> dict:
        rental = event_dict.get("rental_id")
        scope = rental if isinstance(rental, str) and _SAFE_ID.fullmatch(rental) else EVERY_SCOPE
        return {
            key: (value if _kept(key, value) else MASK if _is_secret_key(key) else _scrub_value(value, registry, scope))
            for key, value in event_dict.items()
        }

    return processor


# journald's SyslogLevelPrefix= (on by default) takes a leading "<N>" off a line
# written to its stream and stores N as the entry's PRIORITY.
SYSLOG_PRIORITY = {
    "debug": 7,
    "info": 6,
    "notice": 5,
    "warning": 4,
    "warn": 4,
    "error": 3,
    "exception": 3,
    "critical": 2,
    "fatal": 2,
}


def stream_is_journal(stream: TextIO) -> bool:
    """True when `stream` is the journal stream systemd connected us to: systemd
    sets $JOURNAL_STREAM to the "dev:inode" of that stream (stdout/stderr)."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    device, sep, inode = expected.partition(":")
    if not sep or not device.isdigit() or not inode.isdigit():
        return False
    try:
        info = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):  # StringIO, closed streams
        return False
    return (info.st_dev, info.st_ino) == (int(device), int(inode))


def journald_priority(renderer: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a renderer so each line starts with its syslog priority, "<6>{...}"."""

    def render(logger: Any, name: str, event_dict: dict) -> str:
        priority = SYSLOG_PRIORITY.get(str(event_dict.get("level", name)).lower(), 6)
        return f"<{priority}>{renderer(logger, name, event_dict)}"

    return render


def visible_console(renderer: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap the console renderer so that no field's text acts on the terminal
    (common/visible.py): events quote renters' and containers' text. JSON
    lines need nothing: JSON escapes every control character. A traceback
    keeps its line ends, each of its lines made visible."""

    def shown(key: str, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if key == "exception":
            return "\n".join(visible(line) for line in value.split("\n"))
        return visible(value)

    def render(logger: Any, name: str, event_dict: dict) -> str:
        return renderer(logger, name, {visible(str(k)): shown(str(k), v) for k, v in event_dict.items()})

    return render


# ---- the last warning or error, for `status` -------------------------------------
class LastError:
    """A structlog processor that remembers the newest warning/error line.

    Placed after the redaction processor in logs.configure, so what it keeps is
    already scrubbed. Thread-safe; never changes the event."""

    LEVELS = ("warning", "error", "critical", "exception")
    KEYS = ("error", "hint", "stack_id", "rental_id", "job_id", "container", "phase")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last: dict | None = None
        self.counts: dict[str, int] = {}

    def __call__(self, _logger: Any, method_name: str, event_dict: dict) -> dict:
        level = str(event_dict.get("level") or method_name).lower()
        if level in self.LEVELS:
            entry = {"at": event_dict.get("timestamp"), "level": level, "event": event_dict.get("event")}
            entry.update({key: event_dict[key] for key in self.KEYS if event_dict.get(key) is not None})
            with self._lock:
                self.last = entry
                self.counts[level] = self.counts.get(level, 0) + 1
        return event_dict

    def get(self) -> dict | None:
        with self._lock:
            return dict(self.last) if self.last else None


LAST_ERROR = LastError()


# ---- warnings and stray prints: lines of the log's own format ---------------------
WARNINGS_REMEMBERED = 1000  # distinct warnings said once each; past that, each is said again
STDERR_LINE_KEPT = 4000  # characters of one line a library printed


def capture_warnings() -> None:
    """Python's warnings, the agent's and any library's, become one log line
    each (`python_warning`, at warning level, with their category and origin)
    instead of text on stderr among the JSON lines; a warning said once is not
    said again whatever line raises it again. Python's filters still choose
    which warnings are shown."""
    said: set[tuple[type, str]] = set()
    log = get_logger("py.warnings")

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        key = (category, str(message))
        if key in said:
            return
        if len(said) < WARNINGS_REMEMBERED:
            said.add(key)
        log.warning(
            "python_warning",
            category=f"{category.__module__}.{category.__qualname__}",
            origin=f"{filename}:{lineno}",
            message=str(message)[:STDERR_LINE_KEPT],
        )

    warnings.showwarning = show


class StderrLines(io.TextIOBase):
    """sys.stderr while the agent runs: what a library prints there becomes a
    log line (`stderr_line`, at warning level), so the agent's stderr, which
    the journal keeps, holds the log's own format alone. The log itself writes
    to the stream this replaced (`real`)."""

    def __init__(self, real: TextIO) -> None:
        super().__init__()
        self.real = real
        self._pending = ""
        self._lock = threading.Lock()
        self._log = get_logger("stderr")
        self._inside = threading.local()  # a line said while saying one goes to the real stream

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.real.fileno()

    def write(self, text: str) -> int:
        if getattr(self._inside, "busy", False):
            return self.real.write(text)
        with self._lock:
            lines = (self._pending + text).split("\n")
            self._pending = lines.pop()
            if len(self._pending) > STDERR_LINE_KEPT:  # no end of line yet: bounded all the same
                lines.append(self._pending)
                self._pending = ""
        self._inside.busy = True
        try:
            for line in lines:
                if line.strip():
                    self._log.warning("stderr_line", line=line[:STDERR_LINE_KEPT])
        finally:
            self._inside.busy = False
        return len(text)


def capture_stderr() -> None:
    """Put StderrLines in sys.stderr's place (once: a second call keeps the first)."""
    if not isinstance(sys.stderr, StderrLines):
        sys.stderr = StderrLines(sys.stderr)


def configure(
    level: str = "info",
    *,
    json_lines: bool | None = None,
    stream: TextIO | None = None,
    journal: bool | None = None,
    stderr_only_log: bool = False,
) -> None:
    """JSON lines when not on a terminal (journald, files, CI), readable lines on
    one; on the journal, each line carries its priority prefix (see above).
    Other libraries' standard-library records take the same path (library_logs),
    and so do Python's warnings. `stderr_only_log` (the daemon): whatever else
    is printed to sys.stderr becomes log lines too."""
    number = _level_number(level)
    stream = stream or sys.stderr
    if isinstance(stream, StderrLines):
        stream = stream.real
    if json_lines is None:
        json_lines = not stream.isatty()
    if journal is None:
        journal = stream_is_journal(stream)
    renderer: Callable[..., Any] = (
        structlog.processors.JSONRenderer(sort_keys=False)
        if json_lines
        else visible_console(structlog.dev.ConsoleRenderer(colors=False))
    )
    if journal:
        renderer = journald_priority(renderer)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,  # a traceback becomes a string the redactor scrubs
        redact_processor(SECRETS),
        LAST_ERROR,  # after redaction: `gpuhost-agent status` shows it
    ]
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    library_logs.route_root_logger(stream, [structlog.stdlib.add_logger_name, *shared], renderer, number)
    capture_warnings()
    if stderr_only_log:
        capture_stderr()


def set_level(level: str) -> None:
    """Change the level at run time (SIGHUP), the agent's and the libraries';
    the rest of the setup stays. Raises ValueError for an unknown level,
    leaving the old one in force."""
    number = _level_number(level)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(number))
    library_logs.set_levels(number)


def current_level() -> str:
    """The name of the level now in force ("info"), for reports."""
    wrapper = structlog.get_config()["wrapper_class"]
    for name in ("debug", "info", "warning", "error", "critical"):
        if wrapper is structlog.make_filtering_bound_logger(_level_number(name)):
            return name
    return "unknown"


def _level_number(level: str) -> int:
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r} (use debug, info, warning or error)")
    return number


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)

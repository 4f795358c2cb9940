"""Structured logging for operators, with secrets scrubbed before any line is written.

Operators read these lines in the journal; renters' template variables and the
environment's API key must never reach them.  Redaction happens in two places so
that a careless call site cannot leak: keys whose *name* says secret are masked,
and every registered secret *value* is replaced wherever it appears in a string
(a compose error message can echo an interpolated value, for instance).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import Counter
from typing import Any, Iterable

import structlog

MASK = "***"
# Values shorter than this are too common to scrub without mangling every line
# ("1", "true", "web"); they are also too short to be credentials.
MIN_SECRET_LEN = 4
_SECRET_KEY_HINTS = ("api_key", "apikey", "secret", "password", "token", "environmentvariables", "env_values")


class SecretRegistry:
    """The secret strings known to this process (thread-safe).

    Counted, so that a value two stacks share stays scrubbed until both are
    gone, and a daemon that runs for months does not scan every value any
    stack ever had on each log line.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Counter[str] = Counter()

    def add(self, *values: str | None) -> None:
        with self._lock:
            for value in values:
                if value and len(value) >= MIN_SECRET_LEN:
                    self._values[value] += 1

    def add_many(self, values: Iterable[str]) -> None:
        self.add(*values)

    def discard_many(self, values: Iterable[str]) -> None:
        with self._lock:
            for value in values:
                if self._values.get(value, 0) > 1:
                    self._values[value] -= 1
                else:
                    self._values.pop(value, None)

    def __contains__(self, value: str) -> bool:
        return value in self._values

    def scrub(self, text: str) -> str:
        with self._lock:
            values = sorted(self._values, key=len, reverse=True)
        for value in values:
            if value in text:
                text = text.replace(value, MASK)
        return text


SECRETS = SecretRegistry()


def _is_secret_key(key: str) -> bool:
    folded = key.lower().replace("-", "_")
    return any(hint in folded or hint in folded.replace("_", "") for hint in _SECRET_KEY_HINTS)


def _scrub_value(value: Any, registry: SecretRegistry) -> Any:
    if isinstance(value, str):
        return registry.scrub(value)
    if isinstance(value, dict):
        return {k: (MASK if _is_secret_key(str(k)) else _scrub_value(v, registry)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_scrub_value(v, registry) for v in value)
    if isinstance(value, BaseException):
        return registry.scrub(f"{type(value).__name__}: {value}")
    return value


def redact_processor(registry: SecretRegistry = SECRETS):
    def processor(_logger: Any, _name: str, event_dict: dict) -> dict:
        return {
            key: (MASK if _is_secret_key(key) else _scrub_value(value, registry))
            for key, value in event_dict.items()
        }

    return processor


def configure(level: str = "info", *, json_lines: bool | None = None, stream=None) -> None:
    """JSON lines when not on a terminal (journald, files, CI), readable lines on one."""
    stream = stream or sys.stderr
    if json_lines is None:
        json_lines = not stream.isatty()
    renderer = (
        structlog.processors.JSONRenderer(sort_keys=False)
        if json_lines
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_processor(SECRETS),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_level_number(level)),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


def _level_number(level: str) -> int:
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r} (use debug, info, warning or error)")
    return number


def get_logger(name: str):
    return structlog.get_logger(name)

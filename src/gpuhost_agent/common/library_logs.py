"""Other libraries' standard-library logging, written by the agent's own pipeline.

APScheduler, aiohttp, asyncio and asyncssh log through the
standard `logging` module.  Left alone, their records reach stderr as plain text
through logging's last-resort handler: outside the JSON lines an operator's
tools parse, without a journald priority, and past the secret scrubber (an
exception text can hold an interpolated API key).  One handler on the root
logger sends every such record through the same structlog processors as the
agent's own events (see logs.configure), so a library's line differs from the
agent's only by its `logger` field.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import structlog
from aiohttp.http_exceptions import HttpProcessingError

# Libraries that log routine work at INFO.  APScheduler writes "Running job" and
# "executed successfully" on every run of every periodic job (the heartbeat
# alone would double the journal); aiohttp.access writes a line per HTTP request
# (our servers pass access_log=None, this guards one that forgets).  Below
# this floor they are heard only when the operator asks for debug: their
# warnings and errors (a missed run, a failing handler) always come through.
# asyncssh logs every connection, channel and command at INFO in free text (69 %
# of a busy agent's lines, and a renter's command lines with them): the agent
# logs its own stable events for SSH instead.
QUIET_LIBRARIES = {"apscheduler": logging.WARNING, "aiohttp.access": logging.WARNING, "asyncssh": logging.WARNING}


def set_levels(number: int) -> None:
    """The agent's level for every library (on the root logger), raised to the
    floor of a noisy one unless the agent runs at debug."""
    logging.getLogger().setLevel(number)
    for name, floor in QUIET_LIBRARIES.items():
        logging.getLogger(name).setLevel(number if number <= logging.DEBUG else max(number, floor))


class LineHandler(logging.Handler):
    """Writes each formatted record as one line through a structlog PrintLogger
    on the same stream: structlog keeps one lock per file, so a library's line
    and one of the agent's, written from two threads, never interleave."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self._printer = structlog.PrintLogger(file=stream)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            try:
                line = self.format(record)
            except (TypeError, ValueError):  # arguments that do not fit the message's %-format
                line = self.format(
                    logging.makeLogRecord(
                        {**record.__dict__, "msg": f"{record.msg} (unformattable arguments dropped)", "args": ()}
                    )
                )
            self._printer.msg(line)
        except RecursionError:
            raise
        except Exception:  # a log call must never break its caller
            self.handleError(record)

    def handleError(self, record: logging.LogRecord) -> None:
        """logging.Handler.handleError would print the record's message and
        arguments, unscrubbed; say only which logger lost a line, and why."""
        if not logging.raiseExceptions:
            return
        reason = type(sys.exc_info()[1]).__name__
        try:
            print(
                f"gpuhost-agent: a log line from {record.name} could not be written ({reason})",
                file=sys.stderr,
                flush=True,
            )
        except Exception:  # stderr closed as well: nowhere left to say it
            pass


class UnparsableRequests(logging.Filter):
    """aiohttp logs a request it could not parse (a header line over 8 KiB,
    bad bytes, a missing Host) at ERROR with a traceback. It answered the
    client 400 already; a stray client's bytes are not a bug of ours, so the
    line becomes one INFO event, `http_request_unparsable`, without the
    traceback (and without the bytes, which can be anything)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if record.name == "aiohttp.server" and isinstance(error, HttpProcessingError):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "http_request_unparsable: %s %s", (error.code, type(error).__name__)
            record.exc_info, record.exc_text = None, None
        return True


_installed: LineHandler | None = None


def route_root_logger(
    stream: TextIO, pre_chain: Iterable[Callable[..., Any]], renderer: Callable[..., Any], number: int
) -> LineHandler:
    """Put one LineHandler on the root logger (replacing the one an earlier
    call put there, and no one else's): `pre_chain` gives a record the agent's
    fields and scrubbing, `renderer` makes the line, exactly as for the agent."""
    global _installed
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=list(pre_chain),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = LineHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(UnparsableRequests())
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    root.addHandler(handler)
    _installed = handler
    set_levels(number)
    return handler

"""Crash points for the fault-injection tests.

`GPUHOST_CRASH_AT=<point>` makes the agent kill itself with SIGKILL the first
time it reaches that point: the nearest thing to a power cut or an OOM kill at
an exact step, which a test cannot time from the outside. Unset (always, in
production) a crash point costs one dictionary lookup. The points are listed
in POINTS so that a misspelt one fails the test instead of never firing.
"""

from __future__ import annotations

import os
import signal
import sys

POINTS = (
    "deploy.before_compose_up",  # the stack is checked and written, Compose not started
    "compose.up.running",  # `compose up` has been running for a moment
    "deploy.before_applied_report",  # containers run, APPLIED not yet queued
    "remove.before_compose_down",
    "compose.down.running",
    "remove.before_removed_report",  # containers gone, REMOVED not yet queued
)
ENV = "GPUHOST_CRASH_AT"


def armed(point: str) -> bool:
    wanted = os.environ.get(ENV)
    if wanted and wanted not in POINTS:
        raise ValueError(f"{ENV}={wanted!r} is not a crash point; known: {', '.join(POINTS)}")
    return wanted == point


def crash_point(point: str) -> None:
    if armed(point):
        print(f"gpuhost-agent: crash point {point} reached, killing myself", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

"""How often the agent does its periodic work, as the marketplace sets it in the
session reply (`intervals`) and as both sides assume until it has spoken.

One table for the agent and the local marketplace, and one reader of the
reply, so a default cannot differ between the place that sends it and the
places that use it.
"""

from __future__ import annotations

import math
from typing import Any

from gpuhost_agent.protocol import wire_values

DEFAULT_INTERVALS: dict[str, int] = {
    "jobPollWaitSeconds": 25,
    "containerResyncSeconds": 15,
    "reconcileSeconds": 60,
    "heartbeatSeconds": 30,
    "systemDataSeconds": 300,
    "networkSpeedSeconds": 6 * 3600,
}
# What a reply may set, in seconds: a value outside is taken as the nearest
# bound. Below them a job would run hundreds of times a second (0.001); above,
# the scheduler overflows (1e12) or the work never runs. A long poll waits at
# least a second, or the agent would poll back to back; the work that reads the
# engine and the GPUs runs at most once a second (the hardware report once in
# ten); the tests' fastest heartbeat is 0.2 s.
BOUNDS: dict[str, tuple[float, float]] = {
    "jobPollWaitSeconds": (1.0, 60.0),
    "containerResyncSeconds": (1.0, 86400.0),
    "reconcileSeconds": (1.0, 86400.0),
    "heartbeatSeconds": (0.1, 3600.0),
    "systemDataSeconds": (10.0, 86400.0),
    "networkSpeedSeconds": (60.0, 30 * 86400.0),
}


def seconds(name: str, value: Any) -> float | None:
    """A received value for the interval `name`, held within its BOUNDS; None
    when it is not a number (NaN included)."""
    low, high = BOUNDS[name]
    return _seconds(value, low, high)


def _seconds(value: Any, low: float, high: float) -> float | None:
    """A number held within low and high; None for anything else (NaN included)."""
    if not wire_values.is_number(value):
        return None
    try:
        number = float(value)
    except OverflowError:  # a whole number past a float's range
        number = math.inf if value > 0 else -math.inf
    return None if math.isnan(number) else min(max(number, low), high)


def from_reply(raw: Any) -> dict[str, float]:
    """The defaults, overridden by each number of the reply's `intervals`
    (held within BOUNDS); anything else in it is ignored (problems says what)."""
    given = raw if isinstance(raw, dict) else {}
    intervals = {name: float(value) for name, value in DEFAULT_INTERVALS.items()}
    for name, (low, high) in BOUNDS.items():
        seconds = _seconds(given.get(name), low, high)
        if seconds is not None:
            intervals[name] = seconds
    return intervals


def problems(raw: Any) -> list[str]:
    """What from_reply did not take as sent: each a short line for the log."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [f"intervals is a {type(raw).__name__}, not an object: the defaults are used"]
    said = []
    for name, (low, high) in BOUNDS.items():
        value = raw.get(name)
        if value is None:
            continue
        seconds = _seconds(value, low, high)
        if seconds is None:
            said.append(f"{name} is not a number: {DEFAULT_INTERVALS[name]} s is used")
        elif seconds != value:
            said.append(f"{name} is outside {low:g} to {high:g} s: {seconds:g} s is used")
    return said

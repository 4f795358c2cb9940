"""How often the agent does its periodic work, as the marketplace sets it in the
session reply (`intervals`) and as both sides assume until it has spoken.

One table for the agent and the local marketplace, and one reader of the
reply, so a default cannot differ between the place that sends it and the
places that use it.
"""

from __future__ import annotations

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


def from_reply(raw: Any) -> dict[str, float]:
    """The defaults, overridden by each well-formed (positive number) value of
    the reply's `intervals`; anything else in it is ignored."""
    given = raw if isinstance(raw, dict) else {}
    intervals = {name: float(value) for name, value in DEFAULT_INTERVALS.items()}
    for name in DEFAULT_INTERVALS:
        value = given.get(name)
        if wire_values.is_number(value) and value > 0:
            intervals[name] = float(value)
    return intervals

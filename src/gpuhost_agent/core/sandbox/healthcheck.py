"""A renter's healthcheck, bounded where its cost falls on the host. Pure.

Each probe of a healthcheck is an exec: the engine, containerd and runc set
it up on the host's CPU, outside the rental's cgroup, and the engine tells
every follower of its events (exec_create, exec_start, exec_die, each with
the command and every label). Docker accepts an interval of 1 ms, which runs
probes back to back: one renter's file could keep the host's engine busy for
every renter. So the interval, and the start interval
used during the start period, are at least a second, and the command at most
4 KiB. Compose's normalised model writes durations as Go does ("1m30s",
"1.5s", "500ms").

An image's own HEALTHCHECK is not seen in the file (the image is not
pulled yet): the engine merges it into each container at create time, field
by field, so the started container's is judged with the same bounds
(`started_healthcheck_problem`, on one machine: core/stacks/compose_backend.py).
The agent asks the engine for the actions it follows alone, so probes'
events never reach the agent (protocol/wire.py, CONTAINER_EVENTS).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MIN_INTERVAL_SECONDS = 1.0
MAX_TEST_BYTES = 4096
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(value: Any) -> float | None:
    """A Go duration string ("1m30s", "1.5s", "0s") or a number of seconds,
    in seconds; None when it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    if text in ("", "0"):
        return 0.0
    parts = _PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def healthcheck_problems(service: dict) -> list[str]:
    check = service.get("healthcheck")
    if not isinstance(check, dict) or check.get("disable"):
        return []
    problems = []
    for key in ("interval", "start_interval"):
        if check.get(key) in (None, ""):
            continue
        seconds = duration_seconds(check[key])
        if seconds is None or 0 < seconds < MIN_INTERVAL_SECONDS:
            problems.append(
                f"healthcheck {key} {check[key]!r} is below {MIN_INTERVAL_SECONDS:g} s: each probe is an exec "
                "the host's engine runs, outside the rental's share"
            )
    test = check.get("test")
    text = " ".join(map(str, test)) if isinstance(test, list) else str(test or "")
    size = len(text.encode())
    if size > MAX_TEST_BYTES:
        problems.append(
            f"healthcheck test is {size:,} bytes, at most {MAX_TEST_BYTES:,}: every probe's events carry it; "
            "put a long check in a script of the image"
        )
    return problems


def file_over_image(file_check: Any, image_check: Mapping[str, Any] | None) -> dict:
    """The healthcheck a container of the service gets, as the engine writes
    it (`Config.Healthcheck`, durations in nanoseconds): the file's (Compose's
    normalised model) over its image's, field by field, a field the file
    leaves empty or zero taking the image's; `disable` is no probe at all."""
    image = dict(image_check or {})
    if not isinstance(file_check, Mapping):
        return image
    if file_check.get("disable"):
        return {"Test": ["NONE"]}
    test = file_check.get("test")
    merged = {"Test": ([test] if isinstance(test, str) else list(test or [])) or image.get("Test") or []}
    for key, said in (("Interval", "interval"), ("StartInterval", "start_interval")):
        seconds = duration_seconds(file_check.get(said)) or 0.0
        merged[key] = int(seconds * 1e9) or image.get(key) or 0
    return merged


def started_healthcheck_problem(who: str, check: Mapping[str, Any] | None) -> str | None:
    """A container's healthcheck (`Config.Healthcheck` of Docker's inspect,
    or `file_over_image` before the start: durations in nanoseconds) over the
    bounds above, said for the renter of `who` (a container or a service);
    None when it has none or is within. Zero is the engine's default (30 s);
    an image may carry a negative
    interval, which the engine's API refuses in a file but takes from an
    image, and which runs probes back to back."""
    test = (check or {}).get("Test") or []
    if not isinstance(check, Mapping) or not isinstance(test, list) or not test or test == ["NONE"]:
        return None
    for key, said in (("Interval", "interval"), ("StartInterval", "start_interval")):
        nanoseconds = check.get(key) or 0
        if isinstance(nanoseconds, int) and nanoseconds != 0 and nanoseconds < MIN_INTERVAL_SECONDS * 1e9:
            every = f"every {nanoseconds / 1e6:g} ms" if nanoseconds > 0 else f"back to back ({key} {nanoseconds})"
            return (
                f"{who} probes its health {every} (its image's HEALTHCHECK), at least "
                f"{MIN_INTERVAL_SECONDS:g} s: each probe is an exec the host's engine runs, outside the rental's "
                f"share; set healthcheck.{said} in the file, or healthcheck.disable"
            )
    size = len(" ".join(map(str, test)).encode())
    if size > MAX_TEST_BYTES:
        return (
            f"{who}'s healthcheck test is {size:,} bytes (its image's HEALTHCHECK), "
            f"at most {MAX_TEST_BYTES:,}; set healthcheck.test in the file, or healthcheck.disable"
        )
    return None

"""What the worker's door (streams/door.py) does itself, for the
engine's API has no call for it: this machine's report and disk figures, an
exec's hang-up and an SSH client's signal, where the exec's pids are."""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.records import DiskUsage
from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.streams.door_routes import SIGNALS, Approved, DoorRefused

log = get_logger(__name__)


class MachineSource(Protocol):
    """This machine's report (inventory/machine_report.py's MachineReport)."""

    async def current(self) -> dict: ...

    async def live(self) -> dict: ...


async def act(
    approved: Approved,
    engine: EngineStreams,
    machine: MachineSource | None,
    disk: Callable[[], Awaitable[DiskUsage]] | None,
) -> Mapping[str, Any]:
    """What the engine's API has no call for, done here, where the exec's pids are."""
    if approved.what == "machine":
        if machine is None:
            raise DoorRefused(404, "this agent does not report its machine")
        try:
            live = urllib.parse.parse_qs(approved.target.partition("?")[2]).get("live") == ["1"]
            return await (machine.live() if live else machine.current())
        except Exception as exc:  # a probe that failed is said to the leader, whatever broke in it
            log.warning("machine_report_failed", error=f"{type(exc).__name__}: {exc}"[:300])
            raise DoorRefused(503, f"this machine's report failed: {type(exc).__name__}: {exc}"[:300]) from None
    if approved.what == "disk":
        if disk is None:
            raise DoorRefused(404, "this agent does not measure its disk")
        try:
            return await disk()
        except EngineError as exc:
            raise DoorRefused(503, f"this machine's engine did not say its disk use: {exc}"[:300]) from None
    container_id = str(approved.info.get("Id") or "")
    if approved.what == "hangup":
        await engine.hang_up(approved.ident, container_id)
        return {}
    number = (urllib.parse.parse_qs(approved.target.partition("?")[2]).get("number") or [""])[0]
    if not number.isdigit() or int(number) not in SIGNALS:
        raise DoorRefused(400, f"not a signal an SSH client may send: {number[:10]!r}")
    return {"sent": await engine.signal(approved.ident, container_id, int(number))}

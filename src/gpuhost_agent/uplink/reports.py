"""The reports the agent owes the marketplace: their kinds, and one queued report.

Apart from the outbox that queues them because the client that sends them
needs the same vocabulary (`MarketplaceClient.send_report`), and the outbox
needs the client's errors.
"""

from __future__ import annotations

from dataclasses import dataclass

STATUS, CONTAINERS, JOB_COMPLETE = "status", "containers", "job"
SYSTEM_DATA, INIT_STATE = "systemData", "initState"  # one per agent: target "env"
USAGE = "usage"  # target "<rental id>@<slot start>": a rental's GPU-seconds in one slot (core.usage_meter)
# Dropped first to last when the queue is full: usage last, it is what the host is paid for.
DROP_ORDER = (CONTAINERS, SYSTEM_DATA, INIT_STATE, STATUS, JOB_COMPLETE, USAGE)


@dataclass
class Report:
    kind: str
    target: str  # stack id, job id for JOB_COMPLETE, see above for the others
    body: dict
    version: int = 0
    seq: int = 0  # position in the queue, kept when the body is replaced

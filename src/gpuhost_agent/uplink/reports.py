"""The reports the agent owes the marketplace: their kinds, and one queued report.

Apart from the outbox that queues them because the client that sends them
needs the same vocabulary (`MarketplaceClient.send_report`), and the outbox
needs the client's errors.
"""

from __future__ import annotations

from dataclasses import dataclass

STATUS, CONTAINERS, JOB_COMPLETE = "status", "containers", "job"
SYSTEM_DATA, INIT_STATE = "systemData", "initState"  # one per agent: target "env"
# Dropped first to last when the queue is full.
DROP_ORDER = (CONTAINERS, SYSTEM_DATA, INIT_STATE, STATUS, JOB_COMPLETE)


@dataclass
class Report:
    kind: str
    target: str  # stack id, or job id for JOB_COMPLETE
    body: dict
    version: int = 0
    seq: int = 0  # position in the queue, kept when the body is replaced

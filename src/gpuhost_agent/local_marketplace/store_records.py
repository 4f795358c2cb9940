"""The records the local marketplace's store keeps: a job, a new rental, a new
stack, and the two errors its transitions raise.

Apart from store.py, which holds the rules (when a job is delivered again,
which agent report counts), because these are the shapes the rules act on and
the HTTP handlers answer with: a field added to a rental or stack is added
here once, next to its siblings, and a job's fields are what the JSON file
saves and loads back (`Job(**saved)`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from gpuhost_agent.errors import Refusal
from gpuhost_agent.protocol import wire, wire_jobs, wire_time

QUEUED, DELIVERED, COMPLETED = "queued", "delivered", "completed"


class NotFound(Refusal, LookupError):
    pass


class Conflict(Refusal, ValueError):
    pass


@dataclass
class Job:
    jobId: str
    type: str
    stackId: str
    rentalId: str
    state: str = QUEUED
    createdAt: str = field(default_factory=wire_time.iso)
    deliveredAt: str | None = None
    firstDeliveredAt: str | None = None
    deliveries: int = 0
    completedAt: str | None = None
    outcome: str | None = None
    errorMsg: str | None = None


def new_rental(user_id: str, *, name: str | None, gpu_count: int, end_date: str | None) -> dict:
    """A rental the renter just made: ACTIVE from now."""
    now = wire_time.iso()
    return {
        "rentalId": str(uuid.uuid4()),
        "userId": user_id,
        "name": name or "rental",
        "status": wire.RENTAL_ACTIVE,
        "startDate": now,
        "endDate": end_date,
        "gpuCount": gpu_count,
        "createdAt": now,
        "updatedAt": now,
        "isSeed": False,
    }


def new_stack(env_id: str, rental_id: str, user_id: str, template: wire_jobs.StackTemplate) -> dict:
    """A stack the renter just asked for: APPLYING until the agent reports.
    `desired`, `lastReportAt` and `history` are the store's own bookkeeping
    (shapes.py leaves them out of what the renter sees)."""
    now = wire_time.iso()
    return {
        "stackId": str(uuid.uuid4()),
        "envId": env_id,
        "rentalId": rental_id,
        "userId": user_id,
        "stackName": template["name"],
        "template": template,
        "status": wire.APPLYING,
        "errorMsg": "",
        "pStackName": "",
        "pStackId": 0,
        "tunnels": [],
        "assignedGPUs": [],
        "createdAt": now,
        "updatedAt": now,
        "desired": "present",
        "lastReportAt": "",
        "history": [[wire.APPLYING, now]],
    }

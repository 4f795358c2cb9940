"""State of the local marketplace: one environment, its rentals, stacks and jobs.

Transitions are plain methods on plain data so that the rules (which agent
reports count, when a job is delivered again) are testable without HTTP. The
whole state is saved as one JSON file, written atomically, so that a restart of
`gpuhost-agent run` keeps the renter's ids and keys.
"""

from __future__ import annotations

import json
import secrets
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from gpuhost_agent.common.json_files import write_json_atomically
from gpuhost_agent.local_marketplace.store_records import (  # Job and the errors: handlers import them from here
    COMPLETED,
    DELIVERED,
    QUEUED,
    Conflict,
    Job,
    NotFound,
    new_rental,
    new_stack,
)
from gpuhost_agent.local_marketplace.tunnels import auth as tunnel_auth
from gpuhost_agent.protocol import release_signature, wire, wire_jobs, wire_time, wire_values

LEASE = timedelta(minutes=10)
DESIRED_ENDED_FOR = timedelta(hours=24)  # how long an ended rental stays in the desired state


@dataclass
class Store:
    envId: str
    envApiKey: str
    renterApiKey: str
    userId: str = "local-user"
    envName: str = "local"
    envUpdatedAt: str = ""  # when the renter last renamed it (PATCH /environments/{envId})
    createdAt: str = field(default_factory=wire_time.iso)
    rentals: dict = field(default_factory=dict)
    stacks: dict = field(default_factory=dict)
    live: dict = field(default_factory=dict)  # news from the last heartbeat (gpuAssignments); never saved
    containers: dict = field(default_factory=dict)
    jobs: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)  # the agent's latest systemData report and initState
    sshKeys: list = field(default_factory=list)  # the user's SSH keys (local_marketplace/ssh_keys.py)
    listingSettings: dict = field(default_factory=dict)  # what the host set with PATCH .../listing
    priceHistory: list = field(default_factory=list)  # [since (date-time), price per GPU-hour], oldest first
    usage: dict = field(default_factory=dict)  # "<rentalId>@<slot epoch>" -> the agent's usage (usage.py)
    tunnelSecret: str = field(default_factory=lambda: secrets.token_urlsafe(32))  # tunnel_auth.py derives from it
    # The key this marketplace signs the releases it offers with (protocol/release_signature.py).
    releaseKey: str = field(default_factory=lambda: release_signature.private_text(release_signature.new_private()))
    endpoints: dict = field(default_factory=dict)  # a tunnel's or SSH endpoint's key: its port (tunnels.py)
    path: Path | None = field(default=None, repr=False, compare=False)

    # ---- persistence -------------------------------------------------------
    @classmethod
    def load_or_create(cls, path: Path | None, renter_api_key: str | None = None) -> Store:
        if path is not None and path.exists():
            raw = json.loads(path.read_text())
            raw["jobs"] = {k: Job(**v) for k, v in raw.get("jobs", {}).items()}
            store = cls(**raw)
        else:
            store = cls(
                envId=str(uuid.uuid4()),
                envApiKey="env_" + secrets.token_urlsafe(24),
                renterApiKey="rk_" + secrets.token_urlsafe(24),
            )
        if renter_api_key:
            store.renterApiKey = renter_api_key
        store.path = path
        store.save()
        return store

    def save(self) -> None:
        if self.path is None:
            return
        write_json_atomically(self.path, {k: v for k, v in asdict(self).items() if k not in ("path", "live")})

    # ---- rentals -----------------------------------------------------------
    def create_rental(self, *, name: str | None, gpu_count: int, end_date: str | None) -> dict:
        rental = new_rental(self.userId, name=name, gpu_count=gpu_count, end_date=end_date)
        self.rentals[rental["rentalId"]] = rental
        return rental

    def rental(self, rental_id: str) -> dict:
        try:
            return self.rentals[rental_id]
        except KeyError:
            raise NotFound(f"rental {rental_id} not found") from None

    def end_rental(self, rental_id: str) -> dict:
        rental = self.rental(rental_id)
        if rental["status"] != wire.RENTAL_COMPLETE:
            rental["status"] = wire.RENTAL_COMPLETE
            rental["endDate"] = wire_time.iso()
            rental["updatedAt"] = rental["endDate"]
            for stack in list(self.stacks.values()):
                if stack["rentalId"] == rental_id:
                    self.remove_stack(rental_id, stack["stackId"])
            job = Job(jobId=str(uuid.uuid4()), type=wire.JOB_RENTAL_END, stackId="", rentalId=rental_id)
            self.jobs[job.jobId] = job
        return rental

    def expire_rentals(self, now: datetime | None = None) -> list[str]:
        """End the ACTIVE rentals whose endDate has passed, as a real
        marketplace's billing would; returns their ids."""
        now = now or wire_time.utcnow()
        due = [
            rental_id
            for rental_id, rental in self.rentals.items()
            if rental["status"] == wire.RENTAL_ACTIVE
            and rental.get("endDate")
            and wire_time.parse_iso(rental["endDate"]) <= now
        ]
        for rental_id in due:
            end_date = self.rentals[rental_id]["endDate"]
            self.end_rental(rental_id)
            self.rentals[rental_id]["endDate"] = end_date  # it ended when it was due, not when we noticed
        return due

    def desired_state(self) -> dict:
        """What should run on the machine (GET /agent/desired-state): every
        stack not yet reported REMOVED, with its template, whether the
        renter still wants it, and how many of its jobs are still open; and
        every rental with its status and end."""
        open_jobs: dict[str, int] = {}
        for job in self.jobs.values():
            if job.state != COMPLETED and job.stackId:
                open_jobs[job.stackId] = open_jobs.get(job.stackId, 0) + 1
        stacks = [
            {
                "stackId": stack["stackId"],
                "rentalId": stack["rentalId"],
                "stackName": stack["stackName"],
                "desired": stack["desired"],
                "status": stack["status"],
                "template": stack["template"] if stack["desired"] == "present" else None,
                "openJobs": open_jobs.get(stack["stackId"], 0),
            }
            for stack in self.stacks.values()
        ]
        recent = wire_time.utcnow() - DESIRED_ENDED_FOR
        rentals = [
            {
                "rentalId": rental["rentalId"],
                "status": rental["status"],
                "endDate": rental.get("endDate"),
                "gpuCount": rental.get("gpuCount", 0),
            }
            for rental in self.rentals.values()
            if rental["status"] == wire.RENTAL_ACTIVE or wire_time.parse_iso(rental["updatedAt"]) >= recent
        ]
        return {"envId": self.envId, "generatedAt": wire_time.iso(), "stacks": stacks, "rentals": rentals}

    # ---- stacks ------------------------------------------------------------
    def create_stack(self, rental_id: str, template: wire_jobs.StackTemplate) -> dict:
        rental = self.rental(rental_id)
        if rental["status"] != wire.RENTAL_ACTIVE:
            raise Conflict(f"rental {rental_id} has ended; no new stacks can be created in it")
        stack = new_stack(self.envId, rental_id, self.userId, template)
        if template.get("isBasicAuthEnabled"):
            plain = tunnel_auth.password(self.tunnelSecret, stack["stackId"])
            stack["basicAuth"] = {"username": tunnel_auth.USERNAME, "passwordHash": tunnel_auth.hash_password(plain)}
        self.stacks[stack["stackId"]] = stack
        self._enqueue(wire.JOB_DEPLOY, stack)
        return stack

    def stack(self, rental_id: str, stack_id: str) -> dict:
        stack = self.stacks.get(stack_id)
        if stack is None or stack["rentalId"] != rental_id:
            raise NotFound(f"stack {stack_id} not found in rental {rental_id}")
        return stack

    def next_tunnel_password(self, rental_id: str, stack_id: str) -> tuple[int, str]:
        """The stack's next basic-auth password and its generation (nothing changes yet)."""
        stack = self.stack(rental_id, stack_id)
        credentials = stack.get("basicAuth")
        if not credentials:
            raise Conflict(f"stack {stack_id} has no basic auth (its template's isBasicAuthEnabled is false)")
        generation = int(credentials.get("generation", 0)) + 1
        return generation, tunnel_auth.password(self.tunnelSecret, stack_id, generation)

    def set_tunnel_password(self, rental_id: str, stack_id: str, generation: int, password_hash: str) -> dict:
        """The new password in force: the old one, every session cookie and
        every unused sign-in link of the stack's tunnels stop working
        (tunnel_auth.py). Returns the stack's credentials record."""
        stack = self.stack(rental_id, stack_id)
        stack["basicAuth"] = {**stack["basicAuth"], "generation": generation, "passwordHash": password_hash}
        self.save()
        return stack["basicAuth"]

    def remove_stack(self, rental_id: str, stack_id: str) -> dict:
        stack = self.stack(rental_id, stack_id)
        if stack["desired"] != "absent":
            stack["desired"] = "absent"
            self._set_status(stack, wire.REMOVING, "")
            self._enqueue(wire.JOB_REMOVE, stack)
        return stack

    def _set_status(self, stack: dict, status: str, error_msg: str) -> None:
        stack["status"] = status
        stack["errorMsg"] = error_msg
        stack["updatedAt"] = wire_time.iso()
        stack["history"].append([status, stack["updatedAt"]])

    # ---- jobs --------------------------------------------------------------
    def _enqueue(self, job_type: str, stack: dict) -> Job:
        job = Job(jobId=str(uuid.uuid4()), type=job_type, stackId=stack["stackId"], rentalId=stack["rentalId"])
        self.jobs[job.jobId] = job
        return job

    def deliverable(self, max_jobs: int) -> list[Job]:
        """Jobs to hand out now, marked delivered; a delivered job whose lease ran
        out (an agent that vanished mid-job) is handed out again."""
        now = wire_time.utcnow()
        ready = [
            job
            for job in self.jobs.values()
            if job.state == QUEUED or (job.state == DELIVERED and wire_time.parse_iso(job.deliveredAt) + LEASE < now)
        ]
        for job in ready[:max_jobs]:
            job.state, job.deliveredAt, job.deliveries = DELIVERED, wire_time.iso(now), job.deliveries + 1
            job.firstDeliveredAt = job.firstDeliveredAt or job.deliveredAt
        return ready[:max_jobs]

    def requeue_unfinished(self) -> int:
        """A new agent session means the old one's in-flight work may be lost."""
        unfinished = [job for job in self.jobs.values() if job.state == DELIVERED]
        for job in unfinished:
            job.state = QUEUED
        return len(unfinished)

    def job_payload(self, job: Job) -> dict:
        stack = self.stacks.get(job.stackId, {})
        rental = self.rentals.get(job.rentalId, {})
        return {
            "jobId": job.jobId,
            "type": job.type,
            "stackId": job.stackId,
            "rentalId": job.rentalId,
            "envId": self.envId,
            "stackName": stack.get("stackName", ""),
            "template": stack.get("template") if job.type == wire.JOB_DEPLOY else None,
            "rental": {
                "rentalId": job.rentalId,
                "gpuCount": rental.get("gpuCount", 0),
                "endDate": rental.get("endDate"),
                "status": rental.get("status"),
            },
            "deliveries": job.deliveries,
            "createdAt": job.createdAt,
        }

    def complete_job(self, job_id: str, outcome: str, error_msg: str | None) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        if job.state != COMPLETED:
            job.state, job.completedAt, job.outcome, job.errorMsg = COMPLETED, wire_time.iso(), outcome, error_msg
        return job

    # ---- agent reports -----------------------------------------------------
    def apply_status(self, stack_id: str, report: dict) -> bool:
        """Whether the report changed the stack. Stale reports (older than the
        last one taken) and reports that contradict a requested removal are
        ignored, so that duplicates and reordering are harmless."""
        stack = self.stacks.get(stack_id)
        status = report["status"]
        if stack is None:
            if status == wire.REMOVED:
                return False
            raise NotFound(f"stack {stack_id} not found")
        if stack["lastReportAt"] and wire_time.parse_iso(report["reportedAt"]) < wire_time.parse_iso(
            stack["lastReportAt"]
        ):
            return False
        if stack["desired"] == "absent" and status in (wire.APPLYING, wire.APPLIED):
            return False
        stack["lastReportAt"] = report["reportedAt"]
        stack["pStackName"] = report.get("pStackName") or stack["pStackName"]
        stack["pStackId"] = wire_values.whole(report.get("pStackId")) or stack["pStackId"]
        if isinstance(report.get("assignedGPUs"), list):
            stack["assignedGPUs"] = list(report["assignedGPUs"])
        if status == wire.REMOVED:
            del self.stacks[stack_id]
            self.containers.pop(stack_id, None)
            return True
        # ERROR says what failed; APPLIED may name a container that stopped since (cleared by one without);
        # APPLYING may say why it waits or how far its images are pulled.
        self._set_status(stack, status, (report.get("errorMsg") or "") if status != wire.REMOVING else "")
        return True

    def apply_containers(self, stack_id: str, containers: list, observed_at: str) -> bool:
        if stack_id not in self.stacks:
            raise NotFound(f"stack {stack_id} not found")
        previous = self.containers.get(stack_id)
        if previous and wire_time.parse_iso(observed_at) < wire_time.parse_iso(previous["observedAt"]):
            return False
        self.containers[stack_id] = {"observedAt": observed_at, "containers": containers}
        return True

"""Wire shapes shared by the agent and the local marketplace.

Both sides import these names so that a field renamed on one side breaks the
tests instead of the protocol.  The shapes follow the marketplace's public spec
(`shared/spec/marketplace-api.md`) and `docs/agent-api.yaml`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

API_KEY_HEADER = "X-API-Key"
SESSION_HEADER = "X-Agent-Session"

# Stack.status in the seed, plus REMOVED which exists only in the agent protocol:
# the agent's way to say "nothing of this stack is left"; the marketplace then
# drops the stack from the renter's list.
APPLYING, APPLIED, ERROR, REMOVING, REMOVED = "APPLYING", "APPLIED", "ERROR", "REMOVING", "REMOVED"
STACK_STATUSES = (APPLYING, ERROR, REMOVING, APPLIED)
REPORTED_STATUSES = STACK_STATUSES + (REMOVED,)

RENTAL_ACTIVE, RENTAL_COMPLETE = "ACTIVE", "COMPLETE"

JOB_DEPLOY = "stack.deploy"
JOB_REMOVE = "stack.remove"
# Sent after a rental ends (after the removal jobs of its stacks): the agent
# removes anything of the rental still running and frees its GPUs.
JOB_RENTAL_END = "rental.end"
JOB_TYPES = (JOB_DEPLOY, JOB_REMOVE, JOB_RENTAL_END)

OUTCOME_SUCCEEDED, OUTCOME_FAILED = "succeeded", "failed"

# Labels the agent puts on every container; Docker itself is then the record of
# what the agent owns, and it survives agent restarts.
LABEL_MANAGED = "io.gpuhost.managed"
LABEL_STACK = "io.gpuhost.stack-id"
LABEL_RENTAL = "io.gpuhost.rental-id"
LABEL_ENV = "io.gpuhost.env-id"
AGENT_LABELS = (LABEL_MANAGED, LABEL_STACK, LABEL_RENTAL, LABEL_ENV)

_TEMPLATE_STRINGS = ("name", "description", "content")
_TEMPLATE_FLAGS = ("insecure", "isBasicAuthEnabled", "isSSHEnabled")
MAX_CONTENT_BYTES = 512 * 1024
# Ids become directory and label values on the host: no path separators, no dots first.
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class InvalidBody(ValueError):
    """A request body that does not have the shape the spec requires."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime | None = None) -> str:
    return (moment or utcnow()).isoformat(timespec="microseconds").replace("+00:00", "Z")


def iso_from_timestamp(seconds: float) -> str:
    return iso(datetime.fromtimestamp(seconds, timezone.utc))


def parse_iso(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def is_iso(value: Any) -> bool:
    """Whether a received value is an ISO 8601 date-time."""
    try:
        parse_iso(value)
        return True
    except (TypeError, ValueError, AttributeError):
        return False


def is_number(value: Any) -> bool:
    """A JSON number: int or float, but not a boolean (which Python counts as int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def validate_template(template: Any) -> dict:
    """The seed's Create-stack template, checked and with defaults filled in."""
    if not isinstance(template, dict):
        raise InvalidBody("template must be an object")
    for key in _TEMPLATE_STRINGS:
        if key not in template:
            raise InvalidBody(f"template.{key} is required")
        if not isinstance(template[key], str):
            raise InvalidBody(f"template.{key} must be a string")
    if not template["name"].strip():
        raise InvalidBody("template.name must not be empty")
    if len(template["content"].encode()) > MAX_CONTENT_BYTES:
        raise InvalidBody(f"template.content is larger than {MAX_CONTENT_BYTES} bytes")
    if "environmentVariables" not in template:
        raise InvalidBody("template.environmentVariables is required")
    variables = template["environmentVariables"]
    if not isinstance(variables, dict):
        raise InvalidBody("template.environmentVariables must be an object mapping names to strings")
    for name, value in variables.items():
        if not isinstance(value, str):
            raise InvalidBody(f"template.environmentVariables.{name} must be a string")
    for flag in _TEMPLATE_FLAGS:
        if flag in template and not isinstance(template[flag], bool):
            raise InvalidBody(f"template.{flag} must be a boolean")
    cleaned = {key: template[key] for key in _TEMPLATE_STRINGS}
    cleaned["environmentVariables"] = dict(variables)
    cleaned.update({flag: bool(template.get(flag, False)) for flag in _TEMPLATE_FLAGS})
    return cleaned


@dataclass(frozen=True)
class StackJob:
    """One deploy or remove job as the agent receives it from GET /agent/jobs."""

    job_id: str
    type: str
    stack_id: str
    rental_id: str
    env_id: str
    stack_name: str
    template: dict | None
    gpu_count: int = 0

    @classmethod
    def from_wire(cls, raw: Any) -> "StackJob":
        if not isinstance(raw, dict):
            raise InvalidBody("job must be an object")
        try:
            job = cls(
                job_id=_required_str(raw, "jobId"),
                type=str(raw.get("type")),
                stack_id=_required_str(raw, "stackId") if raw.get("type") != JOB_RENTAL_END else "",
                rental_id=_required_str(raw, "rentalId"),
                env_id=_required_str(raw, "envId"),
                stack_name=str(raw.get("stackName") or ""),
                template=raw.get("template"),
                gpu_count=int((raw.get("rental") or {}).get("gpuCount", 0)),
            )
        except (TypeError, ValueError) as exc:
            raise InvalidBody(f"malformed job: {exc}") from exc
        if job.type not in JOB_TYPES:
            raise InvalidBody(f"unknown job type {job.type!r}")
        if job.type == JOB_DEPLOY:
            validate_template(job.template)
        return job


def is_safe_id(value: object) -> bool:
    return isinstance(value, str) and bool(_SAFE_ID.match(value))


def _required_str(raw: dict, key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not _SAFE_ID.match(value):
        raise InvalidBody(f"{key} must be an id of letters, digits, '_', '.' and '-'")
    return value

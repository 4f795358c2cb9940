"""Wire shapes shared by the agent and the local marketplace.

Both sides import these names so that a field renamed on one side breaks the
tests instead of the protocol.  The shapes follow the marketplace's public spec
(`shared/spec/marketplace-api.md`) and `docs/agent-api.yaml`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeGuard

API_KEY_HEADER = "X-API-Key"
# The agent's refusal of a tunnel whose service does not accept connections yet
# (503): the marketplace tells an HTTP client the service is starting.
TUNNEL_NOT_LISTENING = "the service is not listening on this port yet"
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
LABEL_GPUS = "io.gpuhost.rental-gpus"  # the rental's GPU UUIDs, comma-separated
# On the containers of a stack whose template has isSSHEnabled: the agent's SSH
# server opens only containers that carry it (streams/ssh_access.py).
LABEL_SSH = "io.gpuhost.ssh"
# The SSH login name that picks a container: `<service>.<first 8 characters of
# the stack id>`. The agent's SSH server parses it, the marketplace's tunnel
# info shows it: one rule for both.
SSH_STACK_PREFIX = 8


def ssh_login_name(service: str, stack_id: str) -> str:
    return f"{service}.{stack_id[:SSH_STACK_PREFIX]}"


AGENT_LABELS = (LABEL_MANAGED, LABEL_STACK, LABEL_RENTAL, LABEL_ENV)

_TEMPLATE_STRINGS = ("name", "description", "content")
_TEMPLATE_FLAGS = ("insecure", "isBasicAuthEnabled", "isSSHEnabled")
MAX_CONTENT_BYTES = 512 * 1024
# rental.gpuCount above this is a marketplace bug, not a rental (no host has that many).
MAX_GPU_COUNT = 1024
MAX_POLL_WAIT_SECONDS = 60  # GET /agent/jobs holds a request at most this long (docs/agent-api.yaml)
# Ids become directory and label values on the host: no path separators, no dots first.
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class InvalidBody(ValueError):
    """A request body that does not have the shape the spec requires."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime | None = None) -> str:
    """Always UTC with a Z, as the documents say, whatever offset the moment had
    (a naive moment is taken as UTC)."""
    moment = moment or utcnow()
    moment = moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


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


def is_number(value: object) -> TypeGuard[int | float]:
    """A JSON number: int or float, but not a boolean (which Python counts as int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_whole(value: object, high: int | None = None) -> TypeGuard[int]:
    """A JSON whole number from 0 (to `high`), and not a boolean: counts and ids."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value and (high is None or value <= high)


def whole(value: object, high: int | None = None) -> int | None:
    """A count or id a client sent, as an int, or None if it is not one. A
    float with no fraction counts (JSON Schema's integer is the number's
    value, so 692.0 is an integer there); a boolean does not."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        value = int(value)
    return value if is_whole(value, high) else None


def validate_template(template: Any) -> dict:
    """The seed's Create-stack template, checked and with defaults filled in.

    Both the renter API and the agent decode templates here, so whatever passes
    is safe to hand to the deployer: every string is real Unicode text (a lone
    surrogate cannot be written to a file or passed to Compose) and no
    variable holds a NUL (a process environment cannot carry one). Raises
    InvalidBody and nothing else."""
    if not isinstance(template, dict):
        raise InvalidBody("template must be an object")
    for key in _TEMPLATE_STRINGS:
        if key not in template:
            raise InvalidBody(f"template.{key} is required")
        if not isinstance(template[key], str):
            raise InvalidBody(f"template.{key} must be a string")
        _check_text(template[key], f"template.{key}")
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
        _check_variable(name, value)
    for flag in _TEMPLATE_FLAGS:
        if flag in template and not isinstance(template[flag], bool):
            raise InvalidBody(f"template.{flag} must be a boolean")
    cleaned = {key: template[key] for key in _TEMPLATE_STRINGS}
    cleaned["environmentVariables"] = dict(variables)
    cleaned.update({flag: bool(template.get(flag, False)) for flag in _TEMPLATE_FLAGS})
    return cleaned


def _check_variable(name: Any, value: Any) -> None:
    """One template variable: a name and a value Compose can receive in its environment."""
    if not isinstance(name, str):
        raise InvalidBody("template.environmentVariables names must be strings")
    label = f"template.environmentVariables.{_clip(name)}"
    _check_text(name, f"the name of {label}")
    if "\0" in name:
        raise InvalidBody(f"the name of {label} must not contain a NUL character")
    if not isinstance(value, str):
        raise InvalidBody(f"{label} must be a string")
    _check_text(value, label)
    if "\0" in value:
        raise InvalidBody(f"{label} must not contain a NUL character")


def is_text(value: str) -> bool:
    """Whether a received str is Unicode text any file or process can take."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(value: str, label: str) -> None:
    """JSON may carry lone surrogates (\\ud800), which no file or process can take."""
    if not is_text(value):
        raise InvalidBody(f"{label} is not valid Unicode text (it holds a lone surrogate)")


def _clip(text: str, limit: int = 64) -> str:
    """A received string as it may appear in a message: short, and printable
    as UTF-8 (the marketplace could send anything, of any length)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."


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
    rental_end: str | None = None  # rental.endDate: the host ends the rental then, by its own clock

    @classmethod
    def from_wire(cls, raw: Any) -> StackJob:
        """Decode one job of GET /agent/jobs.

        Raises InvalidBody and nothing else, whatever `raw` holds: the dispatcher
        refuses and reports that job and goes on with the others of the reply.
        What passes has the types the agent relies on (safe ids, a string stack
        name, a checked template for a deploy, a bounded whole GPU count)."""
        if not isinstance(raw, dict):
            raise InvalidBody("job must be an object")
        job_id = _required_str(raw, "jobId")
        job_type = raw.get("type")
        if not isinstance(job_type, str):
            raise InvalidBody(f"unknown job type: type must be a string, one of {', '.join(JOB_TYPES)}")
        if job_type not in JOB_TYPES:
            raise InvalidBody(f"unknown job type {_clip(job_type)!r}")
        return cls(
            job_id=job_id,
            type=job_type,
            stack_id=_required_str(raw, "stackId") if job_type != JOB_RENTAL_END else "",
            rental_id=_required_str(raw, "rentalId"),
            env_id=_required_str(raw, "envId"),
            stack_name=_optional_str(raw, "stackName"),
            template=validate_template(raw.get("template")) if job_type == JOB_DEPLOY else None,
            # Only a deploy hands GPUs out: a removal or a rental's end must go
            # through whatever the rental's record says (a bad count included).
            gpu_count=_gpu_count(raw.get("rental"), strict=job_type == JOB_DEPLOY),
            rental_end=_rental_end(raw.get("rental")),
        )


def is_safe_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(_SAFE_ID.fullmatch(value))


def _required_str(raw: dict, key: str) -> str:
    """An id that becomes a directory name or label value on the host.

    fullmatch, not match: `$` also matches before a trailing newline."""
    if key not in raw:
        raise InvalidBody(f"{key} is required")
    value = raw[key]
    if not isinstance(value, str) or not _SAFE_ID.fullmatch(value):
        raise InvalidBody(
            f"{key} must be an id of letters, digits, '_', '.' and '-'"
            " (1 to 128 characters, starting with a letter or digit)"
        )
    return value


def _optional_str(raw: dict, key: str) -> str:
    """A free-text field that may be absent or null ("" then)."""
    value = raw.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidBody(f"{key} must be a string")
    _check_text(value, key)
    return value


def _rental_end(rental: Any) -> str | None:
    """rental.endDate, normalised; None when the rental has no end (or no rental)."""
    end = rental.get("endDate") if isinstance(rental, dict) else None
    if end is None:
        return None
    if not is_iso(end):
        raise InvalidBody("rental.endDate must be an ISO 8601 date-time or null")
    return iso(parse_iso(end))


def _gpu_count(rental: Any, *, strict: bool) -> int:
    """rental.gpuCount: how many GPUs the sandbox hands out, so a whole number
    within reason; 0 when the job carries no rental. Only a deploy (`strict`)
    is refused for a bad one: a removal hands nothing out and must go through."""
    if rental is None:
        return 0
    if not isinstance(rental, dict):
        raise InvalidBody("rental must be an object")
    count = rental.get("gpuCount", 0)
    if not is_whole(count, MAX_GPU_COUNT):
        if not strict:
            return 0
        raise InvalidBody(f"rental.gpuCount must be a whole number from 0 to {MAX_GPU_COUNT}")
    return count

"""The jobs and templates the agent receives, decoded: what passes has the types and bounds the agent
relies on, and anything else is an InvalidBody naming the field, never another exception."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict, cast

from gpuhost_agent.errors import Refusal
from gpuhost_agent.protocol.wire import JOB_DEPLOY, JOB_RENTAL_END, JOB_TYPES
from gpuhost_agent.protocol.wire_time import is_moment, iso, parse_iso
from gpuhost_agent.protocol.wire_values import SAFE_ID, clipped, is_text, is_whole

_TEMPLATE_STRINGS = ("name", "description", "content")
_TEMPLATE_FLAGS = ("insecure", "isBasicAuthEnabled", "isSSHEnabled")


class StackTemplate(TypedDict, total=False):
    """The seed's Create-stack template as validate_template leaves it: every
    key filled in (total=False only so that "no template" can be an empty one)."""

    name: str
    description: str
    content: str  # the renter's Compose file, as text
    environmentVariables: dict[str, str]
    insecure: bool
    isBasicAuthEnabled: bool
    isSSHEnabled: bool


MAX_CONTENT_BYTES = 512 * 1024
# rental.gpuCount above this is a marketplace bug, not a rental (no host has that many).
MAX_GPU_COUNT = 1024
# A rental's or stack's name, in characters: the local marketplace refuses a
# longer one (400), and the agent shows at most this much of one it receives
# (`gpuhost-agent status`), so that a 10 KB name cannot flood the operator's
# screen. The agent does not refuse or cut a longer stackName when it decodes
# a job: the stack's Compose project is a slug of the name, and the same
# stack must keep the same project whichever path (a job, the desired state)
# the name came by; only its display is bounded (display_name).
MAX_NAME_CHARS = 128


class InvalidBody(Refusal, ValueError):
    """A request body that does not have the shape the spec requires."""


def validate_template(template: Any) -> StackTemplate:
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
    return cast(StackTemplate, cleaned)


def name_problem(name: str, what: str) -> str | None:
    """Why a renter's name for a rental or stack cannot be taken, or None."""
    if len(name) > MAX_NAME_CHARS:
        return f"{what} is {len(name)} characters long, more than the {MAX_NAME_CHARS} a name may have"
    return None


def display_name(name: str) -> str:
    """A received name as the agent shows it: at most MAX_NAME_CHARS, then "..."."""
    return name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS] + "..."


def _check_variable(name: Any, value: Any) -> None:
    """One template variable: a name and a value Compose can receive in its environment."""
    if not isinstance(name, str):
        raise InvalidBody("template.environmentVariables names must be strings")
    label = f"template.environmentVariables.{clipped(name)}"
    _check_text(name, f"the name of {label}")
    if "\0" in name:
        raise InvalidBody(f"the name of {label} must not contain a NUL character")
    if not isinstance(value, str):
        raise InvalidBody(f"{label} must be a string")
    _check_text(value, label)
    if "\0" in value:
        raise InvalidBody(f"{label} must not contain a NUL character")


def _check_text(value: str, label: str) -> None:
    """JSON may carry lone surrogates (\\ud800), which no file or process can take."""
    if not is_text(value):
        raise InvalidBody(f"{label} is not valid Unicode text (it holds a lone surrogate)")


@dataclass(frozen=True)
class StackJob:
    """One deploy or remove job as the agent receives it from GET /agent/jobs."""

    job_id: str
    type: str
    stack_id: str
    rental_id: str
    env_id: str
    stack_name: str
    template: StackTemplate | None
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
            raise InvalidBody(f"unknown job type {clipped(job_type)!r}")
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


def _required_str(raw: dict, key: str) -> str:
    """An id that becomes a directory name or label value on the host.

    fullmatch, not match: `$` also matches before a trailing newline."""
    if key not in raw:
        raise InvalidBody(f"{key} is required")
    value = raw[key]
    if not isinstance(value, str) or not SAFE_ID.fullmatch(value):
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
    if not is_moment(end):
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

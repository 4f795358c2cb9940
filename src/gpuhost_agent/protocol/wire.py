"""Wire shapes shared by the agent and the local marketplace.

Both sides import these names so that a field renamed on one side breaks the
tests instead of the protocol.  The shapes follow the marketplace's public spec
(`shared/spec/marketplace-api.md`) and `docs/agent-api.yaml`.

This module holds the protocol's words: headers, statuses, job types, labels,
and the shapes the agent builds for the seed (Container, GpuStates, at the
end). Beside it: the time format (wire_time.py), the guards of received
values (wire_values.py), the decoding of jobs and templates (wire_jobs.py),
the marketplace's replies (wire_replies.py), systemData (wire_system.py) and
the SSH login rule (ssh_login.py).
"""

from __future__ import annotations

from typing import TypedDict

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
# server opens only containers that carry it (streams/ssh/access.py).
LABEL_SSH = "io.gpuhost.ssh"
# The TCP ports of a container's `expose:` that the engine's record cannot hold
# (a Swarm service has no ExposedPorts): its tunnels' ports too
# (runtime/declared_ports.py). Empty on one machine, where Compose records them.
LABEL_EXPOSED_PORTS = "io.gpuhost.exposed-ports"


AGENT_LABELS = (LABEL_MANAGED, LABEL_STACK, LABEL_RENTAL, LABEL_ENV)

# The container events the agent follows: those that change what a stack's list
# shows. They are asked of the engine by name, so that the others never reach
# the agent: a renter's healthcheck at a 1 ms interval makes exec_create,
# exec_start and exec_die events, each with the command and every label, dozens
# a second per container. The engine matches
# `health_status` as a prefix of `health_status: healthy`.
CONTAINER_EVENTS = (
    *("create", "start", "restart", "stop", "die", "kill", "oom", "pause", "unpause", "destroy"),
    "health_status",
)

MAX_POLL_WAIT_SECONDS = 60  # GET /agent/jobs holds a request at most this long (docs/agent-api.yaml)


class ContainerPort(TypedDict, total=False):
    """One of a Container's `Ports`: PrivatePort and Type always, IP and
    PublicPort only where the engine published the port."""

    PrivatePort: int
    Type: str
    IP: str
    PublicPort: int


class Container(TypedDict):
    """The seed's Container, as the agent reports a stack's containers
    (core/stacks/container_list.py builds it from the engine's list)."""

    Name: str
    Id: str
    Created: int
    Labels: list[str]  # "key=value"
    Ports: list[ContainerPort]
    State: str  # a free string: "running", "exited (137, OOM-killed)"


class GpuStates(TypedDict):
    """A heartbeat's `gpuAssignments`: which GPUs are free, assigned (by
    rental), being released (by rental) and out of service
    (core/gpus/ledger.py)."""

    free: list[str]
    assigned: dict[str, list[str]]
    releasing: dict[str, list[str]]
    outOfService: list[str]

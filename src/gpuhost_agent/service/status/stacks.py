"""The stacks as `gpuhost-agent status` shows them: the agent's record of each,
its name, and its tunnels.

A host operator asked about a stack speaks of it by its name and its rental,
and of its web UI by service and port; the agent's record holds ids and the
Compose project only. So the name is the marketplace's (the last desired
state), else read back from the project, and the tunnels are derived the way
the marketplace derives them (docs/streams.md, section 4): every TCP port a
container of the stack declares, in the container list the agent last
reported, plus the rental's SSH endpoint when the stack's containers carry
the SSH label (its connections counted for each stack the endpoint serves:
which one a login picks, only the agent's SSH server knows). A name is shown
at most 128 characters long (protocol/wire_jobs.py,
display_name): the marketplace could send any length. A tunnel is open while its container runs in an APPLIED stack; its
connections are the tunnel streams the agent relays now. The marketplace
calls conventional web ports `http`; that is its label for the same TCP
relay, so the agent says `tcp`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpuhost_agent.core.stacks import naming
from gpuhost_agent.core.stacks.container_list import SERVICE_LABEL
from gpuhost_agent.protocol import ssh_login, wire, wire_jobs
from gpuhost_agent.storage.agent_db import StackRow
from gpuhost_agent.streams.requests import SshRequest, StreamRequest, TunnelRequest


def stack_entries(
    rows: dict[str, StackRow],
    names: dict[str, str],
    containers_of: Callable[[str], list[wire.Container] | None],
    requests: Iterable[StreamRequest],
) -> list[dict]:
    """One entry per stack of the agent's record, sorted by id. `tunnels` is
    None while no container list of the stack was reported since the start."""
    requests = list(requests)
    entries = []
    for stack_id, row in sorted(rows.items()):
        containers = containers_of(stack_id)
        applied = row.get("status") == wire.APPLIED
        entries.append(
            {
                "stackId": stack_id,
                "name": wire_jobs.display_name(names.get(stack_id) or _name_of(row.get("project") or "", stack_id)),
                "status": row.get("status"),
                "errorMsg": row.get("error_msg") or None,
                "project": row.get("project"),
                "rentalId": row.get("rental_id"),
                "updatedAt": row.get("updated_at"),
                "tunnels": None if containers is None else tunnels(stack_id, containers, applied, requests),
            }
        )
    return entries


def _name_of(project: str, stack_id: str) -> str:
    """The slug of the stack's name that its Compose project begins with (""
    for a stack that had none)."""
    slug = naming.stack_name_of(project, stack_id)
    return "" if slug == "stack" else slug


def tunnels(
    stack_id: str, containers: list[wire.Container], applied: bool, requests: list[StreamRequest]
) -> list[dict]:
    """The stack's tunnels from its containers in the seed's shape (Labels as
    "key=value" strings, Ports with PrivatePort and Type, State)."""
    found = []
    logins = []
    for container in containers:
        name = str(container.get("Name") or "")
        labels = dict(str(label).partition("=")[::2] for label in container.get("Labels") or [])
        service = labels.get(SERVICE_LABEL) or name
        running = str(container.get("State", "")).startswith("running")  # "running (unhealthy)" serves too
        if labels.get(wire.LABEL_SSH) == "true" and running:
            logins.append(ssh_login.ssh_login_name(service, stack_id))
        ids = {container.get("Id"), name, f"/{name}"} - {None, "", "/"}  # a request names it by Id or Name
        ports = sorted({int(p["PrivatePort"]) for p in container.get("Ports") or [] if p.get("Type", "tcp") == "tcp"})
        for port in ports:
            found.append(
                {
                    "service": service,
                    "container": name,
                    "containerId": container.get("Id"),
                    "containerState": container.get("State"),
                    "port": port,
                    "protocol": "tcp",
                    "open": applied and running,
                    "connections": sum(
                        1
                        for r in requests
                        if isinstance(r, TunnelRequest)
                        and r.stack_id == stack_id
                        and r.container_id in ids
                        and r.port == port
                    ),
                }
            )
    if logins:
        ssh = [r for r in requests if isinstance(r, SshRequest) and not r.login.dropped]
        found.append(
            {
                "service": None,
                "container": None,
                "containerId": None,
                "containerState": None,
                "port": None,
                "protocol": "ssh",
                "open": applied,
                "connections": sum(1 for r in ssh if r.login.logged_in and r.login.stack_id == stack_id),
                # not logged in yet: the login name, which picks the stack, comes after the handshake
                "loggingIn": sum(1 for r in ssh if not r.login.logged_in and stack_id in r.stack_ids),
                "logins": sorted(logins),
            }
        )
    return found

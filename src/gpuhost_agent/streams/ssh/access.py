"""Who may log in over SSH, and to which container (docs/streams.md, "ssh").

One SSH endpoint per rental; the login name picks the stack and the
container: `<service>.<first 8 characters of the stack id>`, e.g.
`web.3f2a9c1d`. The prefix says which of the rental's stacks the renter
meant (the ssh request lists them), so two stacks' namesake services are
told apart, and a name copied from another rental's tunnel info fails as an
unknown name does. The container must carry the agent's labels for
this environment, rental and stack, and the SSH label the agent set because
the stack's template has isSSHEnabled: the marketplace's request alone opens
nothing.

Keys: those the marketplace lists for the rental at login time (its renter's
User.sshKeys), cached for a few seconds per rental, so a key the renter adds
works on a running stack within seconds and a login storm is one request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gpuhost_agent.protocol import ssh_login, wire
from gpuhost_agent.runtime.engine.records import ContainerSummary
from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.streams.exec_rate import ExecRate
from gpuhost_agent.streams.ssh.channels import ChannelLedger
from gpuhost_agent.streams.ssh.host_key import HostKey

SERVICE_LABEL = "com.docker.compose.service"
NUMBER_LABEL = "com.docker.compose.container-number"
KEYS_FRESH_SECONDS = 10.0  # a cached list is used as it is
KEYS_RECHECK_SECONDS = 2.0  # an unknown key asks again once the list is this old
MAX_CACHED_RENTALS = 1024


def parse_login(name: str, stack_ids: tuple[str, ...]) -> tuple[str, str] | None:
    """(service, stack id) a login name (ssh_login.ssh_login_name) asks for
    among the endpoint's stacks, or None. A prefix of a stack that is not
    among them (another rental's, one without SSH) is None like any unknown
    name: the renter learns nothing of what exists elsewhere. Two stacks of
    one rental whose ids share 8 characters (uuid4s: about one rental in a
    billion with a hundred stacks) give the first; the other keeps its
    tunnels and terminals."""
    service, dot, prefix = name.rpartition(".")
    if not dot or not service or len(prefix) != ssh_login.SSH_STACK_PREFIX:
        return None
    stack_id = next((s for s in stack_ids if s[: ssh_login.SSH_STACK_PREFIX] == prefix), None)
    return (service, stack_id) if stack_id else None


def _open_to_ssh(
    containers: list[ContainerSummary], env_id: str | None, rental_id: str, stack_id: str
) -> list[ContainerSummary]:
    """The running containers of the stack, with the agent's labels for this
    environment and rental and the SSH label, from `docker ps` entries."""
    if not env_id:
        return []
    wanted = {
        wire.LABEL_MANAGED: "true",
        wire.LABEL_ENV: env_id,
        wire.LABEL_RENTAL: rental_id,
        wire.LABEL_STACK: stack_id,
        wire.LABEL_SSH: "true",
    }
    return [
        c
        for c in containers
        if c.get("State") == "running" and all((c.get("Labels") or {}).get(k) == v for k, v in wanted.items())
    ]


def pick_any(
    containers: list[ContainerSummary], env_id: str | None, rental_id: str, stack_id: str
) -> ContainerSummary | None:
    """Any running container of the stack that a login name can reach (is there an endpoint at all?)."""
    reachable = (
        c for c in _open_to_ssh(containers, env_id, rental_id, stack_id) if (c.get("Labels") or {}).get(SERVICE_LABEL)
    )
    return next(reachable, None)


def pick_container(
    containers: list[ContainerSummary], service: str, env_id: str | None, rental_id: str, stack_id: str
) -> ContainerSummary | None:
    """The running container of `service` (its first replica) that SSH may
    open; None when there is none."""
    found = [
        c
        for c in _open_to_ssh(containers, env_id, rental_id, stack_id)
        if (c.get("Labels") or {}).get(SERVICE_LABEL) == service
    ]
    found.sort(key=lambda c: int(n) if (n := (c.get("Labels") or {}).get(NUMBER_LABEL, "")).isdigit() else 1 << 30)
    return found[0] if found else None


def key_blob(line: str) -> str:
    """The part of an OpenSSH key line that is the key: type and base64 blob."""
    return " ".join(line.split()[:2])


class RentalKeys:
    """The marketplace's keys per rental, briefly cached."""

    def __init__(self, fetch: Callable[[str], Awaitable[list[str]]], clock: Callable[[], float] = time.monotonic):
        self._fetch = fetch
        self._clock = clock
        self._cache: dict[str, tuple[float, frozenset[str]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def allows(self, rental_id: str, key_line: str) -> bool:
        """Whether the key may log in to the rental now. Marketplace errors
        propagate: the login is refused with that reason."""
        blob = key_blob(key_line)
        cached = self._cache.get(rental_id)
        age = self._clock() - cached[0] if cached else None
        if cached and (age is not None and age < KEYS_FRESH_SECONDS) and blob in cached[1]:
            return True
        if cached and age is not None and age < KEYS_RECHECK_SECONDS:
            return blob in cached[1]
        lock = self._locks.setdefault(rental_id, asyncio.Lock())
        async with lock:  # one request per rental however many logins come at once
            cached = self._cache.get(rental_id)
            if not cached or self._clock() - cached[0] >= KEYS_RECHECK_SECONDS:
                keys = frozenset(key_blob(line) for line in await self._fetch(rental_id))
                self._remember(rental_id, keys)
                cached = self._cache[rental_id]
        return blob in cached[1]

    def _remember(self, rental_id: str, keys: frozenset[str]) -> None:
        if len(self._cache) >= MAX_CACHED_RENTALS:
            oldest = min(self._cache, key=lambda rental: self._cache[rental][0])
            self._cache.pop(oldest)
            self._locks.pop(oldest, None)
        self._cache[rental_id] = (self._clock(), keys)


@dataclass(frozen=True)
class SshServices:
    """What every SSH connection of the agent shares. Here, not beside the
    asyncssh server (ssh_server.py), so that building the agent does not
    import asyncssh (streams/ssh/host_key.py says why).

    `list_stack` lists a stack's containers, wherever they run: this
    machine's engine on one machine, the manager's tasks on a Swarm leader
    (runtime/swarm_engine.py); the composition root says which."""

    engine: EngineStreams
    keys: RentalKeys
    host_key: HostKey
    list_stack: Callable[[str], Awaitable[list[ContainerSummary]]]
    channels: ChannelLedger = field(default_factory=ChannelLedger)  # open channels per rental (ssh_channels.py)
    execs: ExecRate = field(default_factory=ExecRate)  # execs started per rental, SSH's and terminals' (exec_rate.py)

    async def stack_containers(self, stack_id: str) -> list[ContainerSummary]:
        return await self.list_stack(stack_id)

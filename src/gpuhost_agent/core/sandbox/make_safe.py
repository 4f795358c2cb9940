"""What a published Compose file asks for that can be made safe, made safe.
Pure: Compose's model in, (new model, notices for the renter, problems) out.

Runs on Compose's normalised model before the policy (sandbox_policy), which
then judges the result as strictly as any other file: a rewrite can only turn
a refused form into one the policy already accepts. Each rewrite is a notice
on the stack, and docs/sandbox-policy.md lists them with their reasons.
"""

from __future__ import annotations

import copy
import re

from gpuhost_agent.core.sandbox import gpu_forms, host_asks
from gpuhost_agent.core.sandbox.context import SandboxContext

# Containers one stack may make, replicas counted: each is a process tree, a
# shim and network endpoints on the host (outside the rental's cgroup), and on
# Swarm a share of the machine (core/swarm/stack_file.py divides it among them).
MAX_CONTAINERS = 32


def rewrite(model: dict, ctx: SandboxContext) -> tuple[dict, list[str], list[str]]:
    model = copy.deepcopy(model)
    notices: list[str] = []
    problems: list[str] = []
    _scope_names(model, ctx, notices, problems)
    for name, service in (model.get("services") or {}).items():
        if not isinstance(service, dict):
            continue
        where = f'service "{name}"'
        host_asks.binds(model, service, ctx, where, notices)
        host_asks.host_network(model, service, ctx, where, notices)
        host_asks.host_ports(service, where, notices)
        _container_name(service, where, notices)
        _develop(service, where, notices)
        _ipc(service, ctx, where, notices)
        _memlock(service, ctx, where, notices)
        _clamp_limits(service, ctx, where, notices)
        host_asks.memory_reservation(service, ctx, where, notices)
        _selinux_type(service, where, notices)
        gpu_forms.normalise(service, ctx, where, notices, problems)
    _containers(model, problems)
    return model, notices, problems


def replicas_of(service: dict) -> int | None:
    """How many containers a service runs (`deploy.replicas`, or Compose's
    older `scale`, the larger); None when it is not a count."""
    deploy = service.get("deploy") or {}
    counts = [deploy.get("replicas"), service.get("scale")]
    if any(n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0) for n in counts):
        return None
    return max((n for n in counts if n is not None), default=1)


def _containers(model: dict, problems: list[str]) -> None:
    """Replicas are containers on this host: bounded per stack, and a service
    runs as replicated tasks (no `global`, no jobs: Swarm would place those
    itself, outside the machine the agent chose)."""
    counts: dict[str, int] = {}
    for name, service in (model.get("services") or {}).items():
        if not isinstance(service, dict):
            continue
        mode = (service.get("deploy") or {}).get("mode")
        if mode not in (None, "replicated"):
            problems.append(
                f'service "{name}": deploy.mode {mode!r} is not allowed: a service runs replicated, '
                "on the machine the agent places it on"
            )
        count = replicas_of(service)
        if count is None:
            problems.append(f'service "{name}": deploy.replicas must be a whole number of containers')
            continue
        counts[name] = count
    total = sum(counts.values())
    if total > MAX_CONTAINERS:
        replicated = ", ".join(f'service "{name}" {count}' for name, count in counts.items() if count > 1)
        problems.append(
            f"deploy.replicas: the stack would run {total} containers ({replicated or 'one per service'}), "
            f"more than the {MAX_CONTAINERS} one stack may run on this host"
        )


def _scope_names(model: dict, ctx: SandboxContext, notices: list[str], problems: list[str]) -> None:
    """A set `name:` or `external: true` becomes a network or volume of the
    stack's own, unless that name exists outside the stack: then it would
    join something that is not the renter's, and stays refused."""
    for section in ("networks", "volumes"):
        kind = section[:-1]
        for key, spec in (model.get(section) or {}).items():
            spec = spec if isinstance(spec, dict) else {}
            own = f"{ctx.project}_{key}"
            name = spec.get("name") or key
            if not spec.get("external") and name == own:
                continue
            if name in ctx.foreign_names:
                problems.append(
                    f'{kind} "{key}": {"external" if spec.get("external") else "name"} {name!r} is not allowed: '
                    f"a {kind} of that name exists outside the stack"
                )
                continue
            what = "external" if spec.get("external") else f"name {name!r}"
            notices.append(f'{kind} "{key}": {what} dropped: the {kind} is the stack\'s own')
            spec.pop("external", None)
            spec["name"] = own
            model[section][key] = spec


def _develop(service: dict, where: str, notices: list[str]) -> None:
    """`develop:` (Compose watch) names host paths (`path: /etc`) that only
    `up --watch` would read or sync from. The agent never runs it, so this is
    defence in depth: no host path of the renter's choosing stays in the
    model Compose runs, whatever a later Compose or agent does with it."""
    if service.pop("develop", None) is not None:
        notices.append(f"{where}: develop dropped: the host does not watch files for a stack")


def _container_name(service: dict, where: str, notices: list[str]) -> None:
    """Container names are one namespace for the whole host: two rentals that
    paste the same file (`container_name: ollama`) would collide, and a name
    could be taken before another rental's stack asks for it. The name is
    dropped (Compose names the container after the stack) and kept as a
    network alias, so the stack's other services still reach it by it."""
    name = service.pop("container_name", None)
    if not name:
        return
    networks = service.get("networks")
    if isinstance(networks, dict) and not service.get("network_mode"):
        for network, spec in networks.items():
            spec = spec if isinstance(spec, dict) else {}
            aliases = spec.setdefault("aliases", [])
            if name not in aliases:
                aliases.append(name)
            networks[network] = spec
    notices.append(
        f"{where}: container_name {name!r} dropped: container names are shared by every rental on the host; "
        f"the stack's services still reach it as {name!r}"
    )


def _ipc(service: dict, ctx: SandboxContext, where: str, notices: list[str]) -> None:
    """`ipc: host` is asked for shared memory (PyTorch's DataLoader, NCCL):
    private IPC with a large /dev/shm inside the rental's memory gives it."""
    if service.get("ipc") != "host":
        return
    service["ipc"] = "private"
    shm = max(_bytes(service.get("shm_size")), ctx.memory_bytes // 2)
    service["shm_size"] = str(min(shm, ctx.memory_bytes))
    notices.append(f"{where}: ipc host became private IPC with shm_size {_gib(int(service['shm_size']))}")


def _memlock(service: dict, ctx: SandboxContext, where: str, notices: list[str]) -> None:
    """`memlock: -1` (unlimited, for RDMA and pinned memory) cannot be given:
    and any value above the engine's own hard limit makes runc fail at start
    ("error setting rlimit type 8: operation not permitted", seen on this
    machine's dockerd with a value clamped to the rental's memory). So a
    memlock beyond the rental's memory is dropped, and the container keeps
    the engine's limit; CUDA's pinned memory works within it."""
    ulimits = service.get("ulimits") or {}
    value = ulimits.get("memlock")
    if value is None:
        return
    numbers = [value.get("soft"), value.get("hard")] if isinstance(value, dict) else [value]
    if all(isinstance(n, int) and 0 <= n <= ctx.memory_bytes for n in numbers):
        return
    del ulimits["memlock"]
    notices.append(f"{where}: ulimits memlock {_shown(value)} dropped: the container keeps the engine's limit")


def _shown(value: object) -> str:
    return "unlimited" if value == -1 or (isinstance(value, dict) and -1 in value.values()) else str(value)


def _clamp_limits(service: dict, ctx: SandboxContext, where: str, notices: list[str]) -> None:
    """Sizes written for a bigger machine (`shm_size: 64gb`, `mem_limit`,
    `cpus`) become the rental's share: the container gets at most that anyway."""
    limits = ((service.get("deploy") or {}).get("resources") or {}).get("limits") or {}
    for holder, key, shown in (
        (service, "shm_size", "shm_size"),
        (service, "mem_limit", "mem_limit"),
        (service, "memswap_limit", "memswap_limit"),
        (limits, "memory", "deploy.resources.limits.memory"),
    ):
        size = _bytes(holder.get(key))
        if size > ctx.memory_bytes:
            holder[key] = str(ctx.memory_bytes)
            notices.append(f"{where}: {shown} {_gib(size)} lowered to the rental's memory ({_gib(ctx.memory_bytes)})")
    for holder, key, shown in ((service, "cpus", "cpus"), (limits, "cpus", "deploy.resources.limits.cpus")):
        cpus = _float(holder.get(key))
        if cpus > ctx.cpus:
            holder[key] = ctx.cpus
            notices.append(f"{where}: {shown} {cpus:g} lowered to the rental's {ctx.cpus:g} CPUs")


def _selinux_type(service: dict, where: str, notices: list[str]) -> None:
    """`label=type:...` picks the SELinux type the container runs as (NVIDIA's
    docs suggest nvidia_container_t): the host's policy decides that, so the
    option is dropped; every other security_opt is the policy's to judge."""
    options = service.get("security_opt") or []
    kept = [opt for opt in options if not re.match(r"^label[=:]type:", str(opt).strip())]
    for dropped in [opt for opt in options if opt not in kept]:
        notices.append(f"{where}: security_opt {dropped} dropped: the host's SELinux policy labels containers")
    if options:
        service["security_opt"] = kept


def _float(value: object) -> float:
    try:
        return float(str(value))
    except ValueError:
        return 0.0


def _bytes(value: object) -> int:
    try:
        return int(float(str(value)))
    except ValueError:
        return 0


def _gib(size: int) -> str:
    return f"{size / 1024**3:.1f} GiB"

"""A hardened stack (sandbox.decide's output) written as a Swarm stack for
`docker stack deploy`. Pure: data in, decision out.

On one machine Compose runs the hardened model as it is. `docker stack deploy`
(Engine 20.10, measured on the test cluster: docs/design.md) applies only part
of it: it ignores `security_opt`, `cgroup_parent`, `privileged`, `restart`,
`shm_size` and `depends_on`, and refuses `mem_limit`, `cpus` and
`pids_limit` outright; it drops `expose` (a service's spec has no such
field: the container's ExposedPorts is null). So every hardening the agent relies on is either
written in a form Swarm applies (limits under `deploy.resources.limits`,
`restart` as `deploy.restart_policy`, the shared-memory size as a tmpfs on
/dev/shm), or held by the node itself (no-new-privileges by each dockerd's
`--no-new-privileges`, which doctor checks on every node; Swarm never starts
a privileged container), or the stack is refused with the reason, in the
sandbox policy's words. Nothing is passed through that is not known to be safe
on Swarm: a key not listed here is refused. The `expose:` ports, which get a
tunnel as on one machine, are written into a label of the container that
Swarm keeps and the tunnels read (runtime/declared_ports.py), never
published: a port Swarm publishes is open on every address of its machine.

The agent, not Swarm, decides where each service runs: a GPU service on the
machine of its GPUs (Swarm cannot pin named GPUs), every other service on the
rental's home machine, each by `node.id`, so Swarm never moves a task to a
machine whose share the ledger did not give. Without the rental's own cgroup
(Swarm has no `cgroup_parent`), the rental's share of a machine is divided
among its tasks there: every replica of every service of the rental on that
machine, this stack's and the others' (`peers`), so that replicas x limits
fit the share. A stack whose tasks would each get less than a usable slice
(MIN_TASK_MEMORY, MIN_CPUS) is refused, naming the count; sandbox_rewrite
caps the containers of one stack (MAX_CONTAINERS) on both kinds of host.

`cgroup: private` is dropped: a Swarm service has no cgroup namespace setting
(the engine's service spec has no such field, and `docker stack deploy`
converts no `cgroupns_mode` into one: docker/cli cli/compose/convert/service.go),
so each node's dockerd must default to it (`default-cgroupns-mode: private`,
already the default on cgroup v2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuhost_agent.core.compose_values import as_mapping, problems_said
from gpuhost_agent.core.sandbox.context import SandboxContext
from gpuhost_agent.core.sandbox.harden import GPU_LABEL
from gpuhost_agent.core.sandbox.make_safe import replicas_of
from gpuhost_agent.core.sandbox.policy import to_bytes
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.runtime.declared_ports import LABEL as EXPOSED_LABEL
from gpuhost_agent.runtime.declared_ports import label_value

POLICY_PREFIX = "refused by the sandbox policy: "
# Service keys Swarm applies as the hardened model states them.
KEPT = frozenset(
    {
        "image", "command", "entrypoint", "environment", "labels", "working_dir", "user", "hostname",
        "domainname", "stop_signal", "stop_grace_period", "healthcheck", "tty", "stdin_open", "read_only",
        "init", "cap_drop", "ulimits", "logging", "extra_hosts", "dns", "dns_search",
    }
)  # fmt: skip
# Keys the rewrite itself turns into Swarm's forms (or drops, being held otherwise).
TRANSLATED = frozenset(
    {
        "deploy", "ports", "networks", "volumes", "restart", "mem_limit", "memswap_limit", "cpus",
        "pids_limit", "shm_size", "security_opt", "privileged", "depends_on", "pull_policy", "ipc",
        "storage_opt", "cgroup", "scale", "expose",
    }
)  # fmt: skip
RESTART_CONDITIONS = {"no": "none", "always": "any", "unless-stopped": "any", "on-failure": "on-failure"}
MIN_CPUS = 0.01
MIN_TASK_MEMORY = 64 * 1024 * 1024  # below this a task is refused rather than started to be OOM-killed


@dataclass(frozen=True)
class SwarmPlacement:
    """Where the ledger put the rental: each GPU's machine, and the machine of its
    services that use no GPU; `peers` counts the rental's services already running
    per machine (other stacks), which share the same share."""

    gpu_nodes: Mapping[str, str]  # GPU UUID -> Swarm node id
    home_node: str
    peers: Mapping[str, int] = field(default_factory=dict)
    encrypted: bool = False  # the host asks for encrypted overlays
    # The rental's (cpus, memory) share of each machine it has GPUs on, where that machine
    # reported its size (core/swarm/machine_shares.py); elsewhere `base_share` (the
    # leader's machine standing in), or the context's when there is none.
    shares: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    base_share: tuple[float, int] | None = None


def swarm_stack(hardened: dict, ctx: SandboxContext, placement: SwarmPlacement) -> tuple[dict, list[str]]:
    """(the Swarm stack, notices for the renter), or StackRejected naming every problem."""
    problems: list[str] = []
    notices: list[str] = []
    services = hardened.get("services") or {}
    nodes = {name: _node(name, service, placement, problems) for name, service in services.items()}
    tasks = {name: replicas_of(service) or 0 for name, service in services.items()}
    sharing = {
        node: placement.peers.get(node, 0) + sum(tasks[name] for name in nodes if nodes[name] == node)
        for node in set(nodes.values())
    }
    stack_services = {}
    for name, service in services.items():
        where = f"service {name!r}"
        for key in sorted(set(service) - KEPT - TRANSLATED):
            problems.append(f"{where}: {key} cannot run on a Swarm environment")
        stack_services[name] = {key: service[key] for key in KEPT if service.get(key) is not None}
        node = nodes[name]
        share = placement.shares.get(node, placement.base_share)
        on_node = ctx if share is None else dataclasses.replace(ctx, cpus=share[0], memory_bytes=share[1])
        _translate(stack_services[name], service, where, (node, sharing[node], tasks[name]), on_node, problems)
        if service.get("depends_on"):
            notices.append(f"{where}: depends_on does not order a Swarm stack's start; its services start together")
    if problems:
        raise StackRejected(POLICY_PREFIX + problems_said(problems))
    stack = {"services": stack_services, "networks": _networks(hardened, placement.encrypted)}
    volumes = {name: _volume(spec) for name, spec in (hardened.get("volumes") or {}).items()}
    if volumes:
        stack["volumes"] = volumes
    return stack, notices


def _node(name: str, service: dict, placement: SwarmPlacement, problems: list[str]) -> str:
    uuids = [uuid for uuid in str(as_mapping(service.get("labels")).get(GPU_LABEL) or "").split(",") if uuid]
    missing = [uuid for uuid in uuids if uuid not in placement.gpu_nodes]
    machines = sorted({placement.gpu_nodes[uuid] for uuid in uuids if uuid not in missing})
    if missing:
        problems.append(f"service {name!r}: GPU {', '.join(missing)} is on no machine of this environment")
    if len(machines) > 1:
        problems.append(
            f"service {name!r}: its GPUs are on {len(machines)} machines and a container runs on one; "
            "split it into one service per machine"
        )
    return machines[0] if machines else placement.home_node


def _translate(
    out: dict, service: dict, where: str, placed: tuple[str, int, int], ctx: SandboxContext, problems: list[str]
) -> None:
    """`placed`: the machine, the rental's tasks there in all, this service's tasks."""
    node, sharing, replicas = placed
    deploy = service.get("deploy") or {}
    if deploy.get("mode") not in (None, "replicated"):
        problems.append(f"{where}: deploy.mode {deploy['mode']!r} would run it on every machine, not the rental's")
    if replicas > 1 and as_mapping(service.get("labels")).get(GPU_LABEL):
        problems.append(f"{where}: a service with GPUs runs one task (deploy.replicas: 1): its GPUs are pinned")
    limits = _limits(service, sharing, ctx)
    each = ctx.memory_bytes // max(sharing, 1)  # the share a task may have; the renter may ask less
    if replicas and (each < MIN_TASK_MEMORY or ctx.cpus / max(sharing, 1) < MIN_CPUS):
        problems.append(
            f"{where}: deploy.replicas {replicas}: the rental would run {sharing} tasks on one machine, each with "
            f"{each // 2**20} MiB of its {ctx.memory_bytes // 2**20} MiB share; "
            f"a task needs at least {MIN_TASK_MEMORY // 2**20} MiB and {MIN_CPUS} CPUs"
        )
    out["deploy"] = {
        "mode": "replicated",
        "replicas": replicas,
        "endpoint_mode": "dnsrr",  # no virtual IP: no IPVS needed, and ports are published per machine
        "placement": {"constraints": [f"node.id == {node}"]},
        "resources": {"limits": limits},
        "restart_policy": _restart_policy(service, deploy, where, problems),
        "labels": dict(as_mapping(service.get("labels"))),
    }
    if service.get("ports"):
        out["ports"] = [_port(port, where, problems) for port in service["ports"]]
    exposed, bad = label_value(service.get("expose") or [])
    problems += [f"{where}: expose {entry!r} is not a container port" for entry in bad]
    if exposed:
        out["labels"] = {**as_mapping(out.get("labels")), EXPOSED_LABEL: exposed}
    if service.get("networks"):
        out["networks"] = {
            net: ({"aliases": list(spec["aliases"])} if isinstance(spec, dict) and spec.get("aliases") else None)
            for net, spec in service["networks"].items()
        }
    mounts = [_mount(mount, where, problems) for mount in service.get("volumes") or []]
    shm = to_bytes(service.get("shm_size"))
    if shm:  # Swarm ignores shm_size: the same size, as the tmpfs Docker mounts there
        mounts.append({"type": "tmpfs", "target": "/dev/shm", "tmpfs": {"size": shm}})
    if mounts:
        out["volumes"] = mounts
    if service.get("ipc") not in (None, "", "private", "shareable"):
        problems.append(f"{where}: ipc {service['ipc']!r} shares memory with another container")


def _limits(service: dict, sharing: int, ctx: SandboxContext) -> dict:
    """The hardened limits of each task, at most the rental's share of the machine
    divided among the rental's tasks there (no rental cgroup holds them together),
    processes included."""
    share = max(sharing, 1)
    memory = min(to_bytes(service.get("mem_limit")) or ctx.memory_bytes, ctx.memory_bytes // share)
    cpus = max(MIN_CPUS, min(float(service.get("cpus") or ctx.cpus), ctx.cpus / share))
    pids = max(1, min(int(service.get("pids_limit") or ctx.pids_limit), ctx.pids_limit // share))
    return {"memory": str(memory), "cpus": f"{cpus:.2f}", "pids": pids}


def _restart_policy(service: dict, deploy: dict, where: str, problems: list[str]) -> dict:
    given = deploy.get("restart_policy")
    if isinstance(given, dict) and given.get("condition") in ("none", "on-failure", "any"):
        return {key: given[key] for key in ("condition", "delay", "max_attempts", "window") if key in given}
    restart = str(service.get("restart") or "no")
    name, _, attempts = restart.partition(":")
    if name not in RESTART_CONDITIONS:
        problems.append(f"{where}: restart {restart!r} is not a restart policy")
        return {"condition": "none"}
    policy: dict = {"condition": RESTART_CONDITIONS[name]}
    if attempts.isdigit():
        policy["max_attempts"] = int(attempts)
    return policy


def _port(port: object, where: str, problems: list[str]) -> dict:
    """Published on the machine that runs the task (no routing mesh), on a port
    the engine picks, as on one machine; Swarm has no host_ip."""
    if not isinstance(port, dict) or not str(port.get("target") or "").isdigit():
        problems.append(f"{where}: port {port!r} is not a container port")
        return {}
    return {"target": int(port["target"]), "protocol": port.get("protocol") or "tcp", "mode": "host"}


def _mount(mount: object, where: str, problems: list[str]) -> dict:
    if not isinstance(mount, dict) or mount.get("type") not in ("volume", "tmpfs"):
        kind = mount.get("type") if isinstance(mount, dict) else mount
        problems.append(f"{where}: a {kind} mount names one machine's files; use a named volume")
        return {}
    return {key: mount[key] for key in ("type", "source", "target", "read_only", "volume", "tmpfs") if key in mount}


def _networks(hardened: dict, encrypted: bool) -> dict:
    """The stack's own overlays: never attachable, so no container outside the
    stack joins them, on any machine."""
    networks = {}
    for name, spec in (hardened.get("networks") or {"default": {}}).items():
        spec = spec or {}
        overlay: dict = {"driver": "overlay", "attachable": False}
        if spec.get("internal"):
            overlay["internal"] = True
        if spec.get("labels"):
            overlay["labels"] = dict(as_mapping(spec["labels"]))
        if encrypted:
            overlay["driver_opts"] = {"encrypted": ""}
        networks[name] = overlay
    return networks


def _volume(spec: dict | None) -> dict:
    """A named volume local to each machine that uses it (Swarm has no shared one)."""
    volume: dict = {"driver": "local"}
    if spec and spec.get("labels"):
        volume["labels"] = dict(as_mapping(spec["labels"]))
    return volume


def stack_nodes(stack: dict) -> set[str]:
    """The nodes a stack written by swarm_stack runs on (its placement constraints)."""
    nodes = set()
    for service in (stack.get("services") or {}).values():
        for constraint in ((service.get("deploy") or {}).get("placement") or {}).get("constraints") or []:
            if str(constraint).startswith("node.id == "):
                nodes.add(str(constraint)[len("node.id == ") :])
    return nodes

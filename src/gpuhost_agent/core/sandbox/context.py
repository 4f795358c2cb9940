"""What one rental may have on this machine: its GPUs, its share of CPU, memory
and processes, where its ports are published. Input to the sandbox policy.

A rental's share is in proportion to its GPUs (a 2-GPU rental on an 8-GPU
machine gets a quarter of the CPUs and memory); a rental without GPUs gets a
fixed small share, so that GPU-less rentals cannot crowd out the GPU ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from gpuhost_agent.protocol.wire_system import HostFacts, StorageFacts
from gpuhost_agent.storage.agent_db import StackRow
from gpuhost_agent.streams.sandbox_addresses import IPNetwork

GIB = 1024**3
GPU_LESS_CPUS = 2.0
GPU_LESS_MEMORY = 4 * GIB
# Memory kept for the host itself (agent, dockerd, the kernel) before sharing out.
HOST_RESERVED_MEMORY = 2 * GIB
HOST_RESERVED_CPUS = 1.0
# How GPUs reach containers, in the probe's words (inventory/gpu_delivery.py):
# CDI device requests, or the NVIDIA runtime hook's `nvidia` driver (also what
# a host with neither is given: its GPU request then fails at the engine).
CDI_DELIVERY = "cdi"
HOOK_DELIVERY = "runtime-hook"


@dataclass(frozen=True)
class Registries:
    """What judging a renter's image registries needs of the host (core/sandbox/host_network.py)."""

    allowed: tuple[str, ...] = ()  # host[:port], local on purpose (GPUHOST_ALLOWED_REGISTRIES)
    host: tuple[IPNetwork, ...] = ()  # the host's own addresses (streams/tunnel.py read_host_networks)
    resolved: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)  # name -> addresses (None: late)
    opened: tuple[IPNetwork, ...] = ()  # private networks the operator opened (GPUHOST_EGRESS_ALLOW)


@dataclass(frozen=True)
class StackSite:
    """Where a stack is on the host, as the deployer knows it before the
    sandbox judges it: its Compose project, where Compose resolved the file's
    paths (`./`, `~` and the agent's own directory), and the networks and
    volumes that exist outside it. The sandbox adds the rental's share and the
    host's settings (SandboxContext)."""

    project: str
    project_dir: str = ""
    home_dir: str = ""
    agent_dir: str = ""
    foreign_names: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, kw_only=True)
class SandboxContext:
    """What judging and hardening one stack needs: its site, the rental's
    share, and the host's settings (service/settings_table.py declares their
    defaults; the sandbox passes the values in effect)."""

    project: str  # the stack's Compose project name
    gpu_uuids: tuple[str, ...] = ()  # the rental's GPUs, in the order renters number them
    cpus: float = GPU_LESS_CPUS
    memory_bytes: int = GPU_LESS_MEMORY
    pids_limit: int
    publish_address: str
    log_max_size: str  # Docker's max-size of each container's log file
    log_max_files: int
    cgroup_parent: str | None = None  # the rental's own cgroup, parent of all its containers
    storage_bytes: int = 0  # each writable layer's size cap, where Docker's disk has quotas (0: none)
    gpu_delivery: str = HOOK_DELIVERY  # the probe's gpuDelivery method: how harden writes GPU requests
    # Where Compose resolved the file's paths: `./` (the stack's directory),
    # `~` (the home the agent gives Compose), and the agent's own directory.
    project_dir: str = ""
    home_dir: str = ""
    agent_dir: str = ""
    foreign_names: frozenset[str] = field(default_factory=frozenset)  # networks and volumes outside the stack
    registries: Registries = field(default_factory=Registries)  # where images may come from


def shown_path(source: str, ctx: SandboxContext) -> str:
    """A path as the renter wrote it (`./data`, `~/.cache`, `../x`), never one
    of the agent's own directories."""
    for root, shown in ((ctx.project_dir, "."), (ctx.home_dir, "~")):
        if under(source, root):
            return shown + source[len(root) :]
    if ctx.project_dir and under(source, ctx.agent_dir):
        return _relative(source, ctx.project_dir)
    return source


def _relative(path: str, start: str) -> str:
    """posixpath.relpath for two absolute paths, without its look at the
    current directory (this runs on the event loop)."""
    to, base = PurePosixPath(path).parts, PurePosixPath(start).parts
    common = 0
    while common < min(len(to), len(base)) and to[common] == base[common]:
        common += 1
    return "/".join([".."] * (len(base) - common) + list(to[common:])) or "."


def under(source: str, root: str) -> bool:
    return bool(root) and (source == root or source.startswith(root + "/"))


@dataclass(frozen=True)
class Machine:
    cpus: int
    memory_bytes: int
    gpus: int


def machine_of(host: HostFacts, gpus: int) -> Machine:
    """A machine's size from its systemData `host` part."""
    return Machine(
        cpus=int((host.get("cpu") or {}).get("logicalCores") or 1),
        memory_bytes=int((host.get("memory") or {}).get("totalBytes") or 0),
        gpus=gpus,
    )


def rental_share(machine: Machine, rental_gpus: int) -> tuple[float, int]:
    """(cpus, memory bytes) a rental's containers may each use at most."""
    usable_cpus = max(1.0, machine.cpus - HOST_RESERVED_CPUS)
    usable_memory = max(GIB, machine.memory_bytes - HOST_RESERVED_MEMORY)
    if rental_gpus <= 0 or machine.gpus <= 0:
        return min(GPU_LESS_CPUS, usable_cpus), min(GPU_LESS_MEMORY, usable_memory)
    fraction = min(1.0, rental_gpus / machine.gpus)
    cpus = round(max(1.0, usable_cpus * fraction), 2)
    memory = int(usable_memory * fraction) // (1024 * 1024) * (1024 * 1024)
    return cpus, max(GIB // 2, memory)


def crowded_rental_problem(stacks: dict[str, StackRow], rental_id: str, stack_id: str, limit: int) -> str | None:
    """Why a rental may not have one more stack on this host: it already has
    `limit` (each makes networks from the address pools all rentals share,
    and containers the host runs for it). `stacks` is the agent's record;
    a stack counts until it is removed, failed ones included."""
    others = [s for s_id, s in stacks.items() if s["rental_id"] == rental_id and s_id != stack_id]
    if not limit or len(others) < limit:
        return None
    return (
        f"this rental already has {len(others)} stacks on this host, the most one rental may have "
        f"({limit}, GPUHOST_STACKS_PER_RENTAL): remove one, failed ones included, and deploy again"
    )


def disk_floor_problem(storage: StorageFacts, floor_bytes: int) -> str | None:
    """Why no stack may start now: Docker's disk has less free space than the
    host's floor. Said before a pull that would fail half-way (or fill the
    disk the host's own system needs); None when there is room or the
    agent cannot see Docker's disk (an engine on another machine)."""
    free = storage.get("freeBytes")
    if not floor_bytes or not isinstance(free, int) or free >= floor_bytes:
        return None
    return (
        f"the host's disk is nearly full: {free / GIB:.1f} GiB free on {storage.get('path')}, below the host's "
        f"floor of {floor_bytes / GIB:.1f} GiB (GPUHOST_DISK_FLOOR); no stack starts until the host frees space"
    )

"""Everything about the machine that is not a GPU: CPU, memory, the disk that
stacks will fill, OS, Docker Engine, Compose, the NVIDIA Container Toolkit and
the clock.

Each part is asked on its own and concurrently (the subprocesses dominate the
probe's time); a part that cannot answer says why in its own `error` field
rather than failing the probe.
"""

from __future__ import annotations

import asyncio
import os
import platform
from pathlib import Path

import psutil

from gpuhost_agent.inventory import clock, gpu_delivery, toolkit
from gpuhost_agent.inventory.storage_quota import read_mountinfo, storage_quota
from gpuhost_agent.protocol.wire_system import StorageFacts
from gpuhost_agent.runtime import dockerd_settings, egress_rules
from gpuhost_agent.runtime.egress_rules import Opening
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.runtime.host_firewall import HostFirewall
from gpuhost_agent.runtime.rental_cgroups import RentalCgroups


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def os_release() -> str | None:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return None


def storage(path: str) -> StorageFacts:
    """The filesystem holding `path` (Docker's data root): stacks' images,
    layers and volumes all land there."""
    probe_path = path
    while probe_path and not os.path.exists(probe_path):
        probe_path = os.path.dirname(probe_path.rstrip("/")) or "/"
    try:
        usage = psutil.disk_usage(probe_path or "/")
    except OSError as exc:
        return {"path": path, "totalBytes": None, "freeBytes": None, "error": str(exc)}
    return {"path": path, "totalBytes": usage.total, "freeBytes": usage.free, "error": None}


async def docker_facts(engine: DockerEngine, gpu_check_image: str | None) -> dict:
    try:
        info = await engine.info()
    except EngineError as exc:
        return {
            "available": False,
            "error": str(exc),
            "version": None,
            "rootDir": None,
            "gpuContainers": {"ok": False, "method": "none", "detail": "Docker Engine unreachable"},
            "gpuDelivery": {"method": gpu_delivery.NONE, "detail": "Docker Engine unreachable"},
        }
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    version = info.get("Version") or {}
    facts = {
        "available": True,
        "error": None,
        "version": info.get("ServerVersion"),
        "apiVersion": version.get("ApiVersion"),
        "rootDir": info.get("DockerRootDir"),
        "runtimes": runtimes,
        "defaultRuntime": info.get("DefaultRuntime"),
        "cdiSpecDirs": info.get("CDISpecDirs") or [],
        "cgroupDriver": info.get("CgroupDriver"),
        "cgroupVersion": info.get("CgroupVersion"),
        "swarm": swarm_facts(info.get("Swarm") or {}),
        # dockerd's own proxies: whether its pulls go through the pull guard (docker info masks credentials).
        "proxies": {
            "http": info.get("HttpProxy") or "",
            "https": info.get("HttpsProxy") or "",
            "no": info.get("NoProxy") or "",
        },
    }
    facts["storageQuota"] = storage_quota(info, await asyncio.to_thread(read_mountinfo))
    facts["rentalLimits"] = await asyncio.to_thread(rental_limits, info.get("CgroupDriver"), info.get("CgroupVersion"))
    facts["gpuContainers"] = await _gpu_containers(engine, facts, gpu_check_image)
    facts["gpuDelivery"] = await asyncio.to_thread(delivery, facts)
    facts.update(await asyncio.to_thread(dockerd_settings.engine_defaults, None, info.get("CgroupVersion")))
    facts["fence"] = await asyncio.to_thread(fence_facts)
    return facts


def fence_facts() -> dict:
    """Whether dockerd is in the engine fence's group (runtime/egress_rules.py):
    {"group": its id or None where the host has none, "dockerd": True/False, or
    None with `detail` when it cannot be told}. Blocking."""
    gid = HostFirewall().engine_gid()
    groups = dockerd_settings.engine_groups()
    if isinstance(groups, str):
        return {"group": gid, "dockerd": None, "detail": groups}
    return {"group": gid, "dockerd": gid is not None and gid in groups, "detail": None}


def delivery(docker: dict) -> dict:
    """Which way GPUs reach containers (inventory/gpu_delivery.py): the CDI
    specs in dockerd's own folders, and the runtime hook's signs. Blocking reads."""
    directories = tuple(docker.get("cdiSpecDirs") or ())
    facts = gpu_delivery.DeliveryFacts(
        cdi_spec_dirs=directories,
        specs=gpu_delivery.read_specs(directories),
        hook=toolkit.find_binaries().get("nvidia-container-runtime-hook", ""),
        runtimes=tuple(docker.get("runtimes") or ()),
    )
    return gpu_delivery.decide(facts)


def rental_limits(cgroup_driver: str | None, cgroup_version: str | None) -> dict:
    """Whether a rental's containers share one cgroup with the rental's limits
    (runtime/rental_cgroups.py), as the agent will find it at the first
    deploy; the operator sees why not before any renter does."""
    why_not = RentalCgroups().configure(cgroup_driver or "", str(cgroup_version or ""))
    how = "a systemd slice per rental" if cgroup_driver == "systemd" else "a cgroup per rental"
    return {"perRental": why_not is None, "detail": why_not or f"{how} ({cgroup_driver}, cgroup v{cgroup_version})"}


def swarm_facts(swarm: dict) -> dict:
    """This engine's place in a Swarm, from `docker info`: "inactive" on a
    machine of its own."""
    return {
        "state": swarm.get("LocalNodeState") or "inactive",
        "nodeId": swarm.get("NodeID") or None,
        "manager": bool(swarm.get("ControlAvailable")),
        "nodes": swarm.get("Nodes"),
    }


async def _gpu_containers(engine: DockerEngine, facts: dict, image: str | None) -> dict:
    """Whether a renter's `--gpus` request can work. With a local check image
    configured we start a real GPU container; without one we read the signs:
    an nvidia runtime, an NVIDIA CDI spec, or the toolkit's hook that dockerd
    uses for `--gpus`."""
    if image:
        problem = await engine.gpu_container_check(image)
        return {"ok": problem is None, "method": "container", "image": image, "detail": problem}
    signs = []
    if "nvidia" in facts["runtimes"]:
        signs.append("nvidia runtime registered")
    for directory in facts["cdiSpecDirs"] or gpu_delivery.DEFAULT_SPEC_DIRS:
        if any(p.name.startswith("nvidia") for p in await asyncio.to_thread(_listdir, directory)):
            signs.append(f"NVIDIA CDI spec in {directory}")
    if (await asyncio.to_thread(toolkit.find_binaries)).get("nvidia-container-runtime-hook"):
        signs.append("nvidia-container-runtime-hook installed")
    return {
        "ok": bool(signs),
        "method": "engine-info",
        "detail": ", ".join(signs) or "no nvidia runtime, CDI spec or nvidia-container-runtime-hook found",
    }


def _listdir(directory: str) -> list[Path]:
    try:
        return list(Path(directory).iterdir())
    except OSError:
        return []


async def compose_facts(command: list[str] | None) -> dict:
    if not command:
        return {"available": False, "version": None, "command": None, "error": "Docker Compose v2 not found"}
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            "version",
            "--short",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 15)
    except (OSError, asyncio.TimeoutError) as exc:
        return {"available": False, "version": None, "command": " ".join(command), "error": str(exc) or "timed out"}
    if process.returncode != 0:
        return {
            "available": False,
            "version": None,
            "command": " ".join(command),
            "error": err.decode(errors="replace").strip()[:300],
        }
    return {"available": True, "version": out.decode().strip().lstrip("v"), "command": " ".join(command), "error": None}


async def probe_host(
    engine: DockerEngine,
    compose_command: list[str] | None,
    *,
    gpu_check_image: str | None = None,
    toolkit_config: Path | None = None,
    egress_allow: tuple[str, ...] = (),
    egress_openings: tuple[Opening, ...] = (),
) -> dict:
    docker, compose, nvidia_toolkit, unconfined = await asyncio.gather(
        docker_facts(engine, gpu_check_image),
        compose_facts(compose_command),
        toolkit.probe_toolkit(config_path=toolkit_config),
        _unconfined_networks(engine),
    )
    # /proc, /sys, /etc/os-release, statvfs and adjtimex (whose libc lookup runs
    # ldconfig): blocking reads, made in a thread.
    machine = await asyncio.to_thread(_this_machine, docker, compose, nvidia_toolkit, egress_allow, egress_openings)
    machine["egress"]["unconfinedNetworks"] = unconfined
    return machine


async def _unconfined_networks(engine: DockerEngine) -> list[str] | None:
    """The agent's networks the egress rules do not hold (None: the engine did not answer)."""
    try:
        return egress_rules.unconfined(await engine.managed_networks())
    except EngineError:
        return None


def _this_machine(
    docker: dict, compose: dict, nvidia_toolkit: dict, egress_allow: tuple[str, ...], openings: tuple[Opening, ...]
) -> dict:
    memory = psutil.virtual_memory()
    return {
        "cpu": {
            "model": cpu_model(),
            "physicalCores": psutil.cpu_count(logical=False),
            "logicalCores": psutil.cpu_count(logical=True),
        },
        "memory": {"totalBytes": memory.total},
        "storage": storage(docker.get("rootDir") or "/var/lib/docker"),
        "os": {"name": os_release(), "kernel": platform.release(), "arch": platform.machine()},
        "docker": docker,
        "compose": compose,
        "nvidiaContainerToolkit": nvidia_toolkit,
        "clock": clock.kernel_clock_state(),
        "egress": HostFirewall().facts(egress_allow, openings),
    }

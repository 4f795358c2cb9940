"""Write a policy-checked Compose model back explicitly hardened. Pure.

Whatever the renter did not say is said by the agent, so nothing depends on
Docker's defaults or on what the image carries: no new privileges, the
capabilities no workload needs dropped, limits set to the rental's share, GPUs
given by UUID to the services that asked and explicitly none to the others
(through CDI or the NVIDIA runtime hook, whichever way the host's probe found:
inventory/gpu_delivery.py), a cgroup namespace of its own, ports published
where the host decides.

The image is as untrusted as the file: its ENV and its labels are laid under
what the agent sets, so every variable the NVIDIA Container Toolkit reads to
give devices or driver parts, and every label of the agent's own namespace
(core/stacks/naming.py), is set on every container, to the renter's allowed value or
to one that gives nothing.
"""

from __future__ import annotations

import copy

from gpuhost_agent.core.compose_values import as_mapping
from gpuhost_agent.core.sandbox.context import CDI_DELIVERY, SandboxContext
from gpuhost_agent.core.sandbox.gpu_forms import NVIDIA_CAPABILITIES
from gpuhost_agent.core.sandbox.policy import flat_capabilities, gpu_requests, to_bytes
from gpuhost_agent.runtime.egress_rules import BRIDGE_OPTION, bridge_name

NO_NEW_PRIVILEGES = "no-new-privileges:true"
# Dropped from every container. Docker's default set keeps MKNOD, NET_RAW and
# AUDIT_WRITE (device nodes, raw sockets for spoofing on the bridge, the host's
# audit log); the rest are not in the default set and are listed so that no
# path can ever bring them back.
ALWAYS_DROP = (
    "AUDIT_WRITE",
    "MKNOD",
    "NET_ADMIN",
    "NET_RAW",
    "SYS_ADMIN",
    "SYS_MODULE",
    "SYS_PTRACE",
    "SYS_RAWIO",
    "SYS_TIME",
    "SYS_BOOT",
    "DAC_READ_SEARCH",
)  # not BPF/PERFMON: Docker 20.10 refuses those names
NO_GPUS = "void"  # NVIDIA's value for "no GPU at all", stronger than an unset variable
# The toolkit's `swarm-resource` setting makes it take GPUs from a variable of
# these names (Swarm's generic resources) before NVIDIA_VISIBLE_DEVICES: each is
# given the rental's GPUs too, and any other DOCKER_RESOURCE_* a file sets as well
# (an image's own is refused: core/sandbox/image_config.py).
TOOLKIT_RESOURCE_PREFIX = "DOCKER_RESOURCE_"
TOOLKIT_RESOURCES = ("DOCKER_RESOURCE_GPU", "DOCKER_RESOURCE_NVIDIA-GPU", "DOCKER_RESOURCE_NVIDIA_GPU")
GPU_LABEL = "io.gpuhost.gpus"
# The toolkit's variables that add devices, each at the value that adds none:
# it reads them from the process environment, the image's ENV included
# (nvidia-container-toolkit: cmd/nvidia-container-runtime-hook/container_config.go,
# internal/modifier/gated.go). An empty MIG or IMEX list is no device; the
# feature gates open only on "enabled". The renter cannot set them
# (sandbox_gpu_forms drops them), so the agent's value is the only one.
NO_EXTRA_DEVICES = {
    "NVIDIA_MIG_CONFIG_DEVICES": "",
    "NVIDIA_MIG_MONITOR_DEVICES": "",
    "NVIDIA_IMEX_CHANNELS": "",
    "NVIDIA_GDS": "disabled",
    "NVIDIA_MOFED": "disabled",
    "NVIDIA_NVSWITCH": "disabled",
    "NVIDIA_GDRCOPY": "disabled",
}
DRIVER_CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
# The toolkit's own default when the variable is empty; unset in a "legacy"
# image (CUDA_VERSION without NVIDIA_REQUIRE_CUDA) would mean all of them.
DEFAULT_DRIVER_CAPABILITIES = "compute,utility"
CDI_GPU_NAME = "nvidia.com/gpu={}"  # a GPU in NVIDIA's CDI spec, by UUID (inventory/gpu_delivery.py)


def assigned_uuids(service: dict, ctx: SandboxContext) -> list[str]:
    """The rental's GPUs this service asked for (policy already checked the asks)."""
    chosen: list[str] = []
    for request in gpu_requests(service):
        count, devices = request.get("count"), request.get("device_ids") or []
        if devices:
            wanted = [ctx.gpu_uuids[int(d)] if str(d).isdigit() else str(d) for d in devices]
        elif count in (None, -1, "all"):
            wanted = list(ctx.gpu_uuids)
        else:
            wanted = list(ctx.gpu_uuids[: int(count)])
        chosen += [uuid for uuid in wanted if uuid not in chosen]
    return [uuid for uuid in ctx.gpu_uuids if uuid in chosen]  # the rental's order


def harden(model: dict, ctx: SandboxContext) -> dict:
    hardened = copy.deepcopy(model)
    for service in (hardened.get("services") or {}).values():
        _harden_service(service, ctx)
    _bridges(hardened, ctx)
    return hardened


def _bridges(model: dict, ctx: SandboxContext) -> None:
    """Every network of the stack is a bridge named by the agent, so the
    host's egress rules (runtime/egress_rules.py) match every rental's traffic
    by one prefix. The policy refuses a renter's own driver_opts. IPv6 is off
    whatever the engine's default-network-opts say: the rules are IPv4's
    (and the host's INPUT for IPv6 link-local)."""
    networks = model.get("networks") or {}
    for name in networks:
        spec = networks[name] or {}
        spec["driver_opts"] = {BRIDGE_OPTION: bridge_name(ctx.project, name)}
        spec["enable_ipv6"] = False
        networks[name] = spec


def _harden_service(service: dict, ctx: SandboxContext) -> None:
    service.pop("profiles", None)  # Compose chose the services already: every one in the model runs
    service["security_opt"] = [NO_NEW_PRIVILEGES]
    service["cap_drop"] = sorted(set(service.get("cap_drop") or []) | set(ALWAYS_DROP))
    service.pop("cap_add", None)
    service["privileged"] = False
    # The container's own cgroup namespace: with the engine's default on cgroup
    # v1 (host) it would read the host's cgroup paths. Policy refuses any other.
    service["cgroup"] = "private"
    _limits(service, ctx)
    if ctx.cgroup_parent:  # the rental's limits hold for all its containers together
        service["cgroup_parent"] = ctx.cgroup_parent
    if ctx.storage_bytes:  # a real quota (overlay2 on XFS with pquota, btrfs): inventory/storage_quota.py
        service["storage_opt"] = {"size": str(ctx.storage_bytes)}
    _logging(service, ctx)
    _gpus(service, ctx)
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            port["host_ip"] = ctx.publish_address
            port.pop("published", None)  # the engine picks a free host port


def _limits(service: dict, ctx: SandboxContext) -> None:
    """Every container capped at the rental's share, or lower where the renter said so."""
    deploy = service.get("deploy") or {}
    limits = (deploy.get("resources") or {}).pop("limits", None) or {}
    memory = min(
        x
        for x in (to_bytes(service.get("mem_limit")), to_bytes(limits.get("memory")), ctx.memory_bytes)
        if x is not None
    )
    cpus = min(float(x) for x in (service.get("cpus"), limits.get("cpus"), ctx.cpus) if x not in (None, "", 0))
    pids = min(int(x) for x in (service.get("pids_limit"), limits.get("pids"), ctx.pids_limit) if x not in (None, 0))
    service["mem_limit"] = str(memory)
    service["memswap_limit"] = str(memory)  # no swap on top of the limit
    service["cpus"] = cpus
    service["pids_limit"] = pids
    shm = to_bytes(service.get("shm_size"))
    if shm is not None:
        service["shm_size"] = str(min(shm, memory))


def _logging(service: dict, ctx: SandboxContext) -> None:
    """Every container's log capped at the host's size x files, whatever the
    renter set: a container printing as fast as it can must not fill the
    disk (Docker's json-file keeps everything by default). The renter's
    driver stays if it is one the policy allows (json-file or local)."""
    driver = (service.get("logging") or {}).get("driver") or "json-file"
    service["logging"] = {
        "driver": driver,
        "options": {"max-size": ctx.log_max_size, "max-file": str(ctx.log_max_files)},
    }


def _gpus(service: dict, ctx: SandboxContext) -> None:
    uuids = assigned_uuids(service, ctx)
    # What the renter asked the driver for (compute, utility, video...), GPUs always.
    capabilities = sorted(
        {
            "gpu",
            *(cap for request in gpu_requests(service) for cap in flat_capabilities(request.get("capabilities") or [])),
        }
    )
    service.pop("gpus", None)
    resources = (service.setdefault("deploy", {})).setdefault("resources", {})
    reservations = resources.setdefault("reservations", {})
    reservations.pop("devices", None)
    environment = as_mapping(service.get("environment"), missing=None)
    labels = as_mapping(service.get("labels"))
    if uuids:
        reservations["devices"] = [_request(uuids, capabilities, ctx)]
    visible = ",".join(uuids) if uuids else NO_GPUS
    environment["NVIDIA_VISIBLE_DEVICES"] = visible
    asked = [str(name) for name in environment if str(name).upper().startswith(TOOLKIT_RESOURCE_PREFIX)]
    for name in (*TOOLKIT_RESOURCES, *asked):
        environment[name] = visible
    if not reservations:
        resources.pop("reservations")
    environment.update(NO_EXTRA_DEVICES)
    environment[DRIVER_CAPABILITIES] = _driver_capabilities(environment.get(DRIVER_CAPABILITIES), capabilities)
    labels[GPU_LABEL] = ",".join(uuids)
    service["environment"] = environment
    service["labels"] = labels


def _request(uuids: list[str], capabilities: list[str], ctx: SandboxContext) -> dict:
    """The one GPU request of a service, for the way GPUs reach containers here.
    With CDI, dockerd applies the spec's edits for each name itself (no hook,
    no runtime), and ignores a cdi request's capabilities (moby
    daemon/devices.go); Compose 2.26 still wants the key (its schema: "capabilities
    is required"), so they are written as for the hook. Either way the
    rental's GPUs by UUID, whatever the renter spelled."""
    if ctx.gpu_delivery == CDI_DELIVERY:
        names = [CDI_GPU_NAME.format(uuid) for uuid in uuids]
        return {"driver": "cdi", "device_ids": names, "capabilities": capabilities}
    return {"driver": "nvidia", "device_ids": uuids, "capabilities": capabilities}


def _driver_capabilities(asked: object, requested: list[str]) -> str:
    """Which driver parts the toolkit mounts: the renter's variable (the
    policy checked its values), else the capabilities its reservation names,
    else the toolkit's default; never what the image's ENV says."""
    if asked not in (None, ""):
        return str(asked)
    named = [cap for cap in requested if cap in NVIDIA_CAPABILITIES - {"gpu", "nvidia"}]
    return ",".join(named) or DEFAULT_DRIVER_CAPABILITIES

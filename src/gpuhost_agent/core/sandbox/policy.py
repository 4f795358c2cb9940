"""The sandbox policy on a stack's Compose model. Pure: data in, decision out.

It runs on Compose's own normalised model (`docker compose config --format
json`), after interpolation, anchors, merge keys and `extends`, so that what is
judged is exactly what would run. Each refusal names the service and the key,
and says why, for the renter who wrote the file. What passes is then
rewritten by sandbox_harden. The full list, with reasons, is in
docs/sandbox-policy.md.
"""

from __future__ import annotations

import posixpath
from typing import Any

from gpuhost_agent.core.compose_values import as_mapping
from gpuhost_agent.core.sandbox.context import SandboxContext, shown_path
from gpuhost_agent.core.sandbox.gpu_forms import NVIDIA_CAPABILITIES, PASSED_VARIABLES, is_toolkit_variable
from gpuhost_agent.core.sandbox.healthcheck import healthcheck_problems
from gpuhost_agent.core.sandbox.host_network import exposed_ports_problem, image_problems, published_ports_problem
from gpuhost_agent.core.sandbox.label_size import file_labels_problem, stack_resources_problem
from gpuhost_agent.core.sandbox.networks import attachment_problems, device_list_mounts, network_problems

AGENT_LABEL_PREFIXES = ("io.gpuhost.", "com.docker.compose.")
DRIVER_CAPABILITY_VALUES = {"all", "compute", "compat32", "graphics", "utility", "video", "display"}
# Service keys refused whatever their value, with the reason shown to the renter.
FORBIDDEN_KEYS = {
    "devices": "it gives the container host devices",
    "device_cgroup_rules": "it opens host devices to the container",
    "cap_add": "extra kernel capabilities reach outside the container",
    "sysctls": "kernel settings are the host's",
    "runtime": "the container runtime is chosen by the host",
    "cgroup_parent": "the agent places containers in the host's cgroups",
    "userns_mode": "the user namespace is the host's to choose",
    "external_links": "it links to containers outside the stack",
    "blkio_config": "it names the host's block devices",
    "storage_opt": "storage options are the host's",
    "cpuset": "CPU pinning would take CPUs other rentals use",
    "cpu_quota": "use cpus: instead",
    "cpu_period": "use cpus: instead",
    "cpu_rt_runtime": "real-time scheduling is the host's",
    "cpu_rt_period": "real-time scheduling is the host's",
    "credential_spec": "credentials are the host's",
    "provider": "provider services run programs on the host",
    "use_api_socket": "it gives the container the Docker API",
    "isolation": "isolation technology is the host's to choose",
    "oom_kill_disable": "a container that cannot be OOM-killed can starve the host",
    "annotations": "the NVIDIA toolkit takes CDI device requests from annotations, around the agent's GPUs",
    "build": "images are pulled, not built on the host",
    "env_file": "it reads a file of the host",
    "label_file": "it reads a file of the host",
}
NAMESPACE_KEYS = ("network_mode", "pid", "ipc", "uts", "cgroup")
ALLOWED_SECURITY_OPTS = ("no-new-privileges", "no-new-privileges:true", "no-new-privileges=true")
ULIMIT_CEILINGS = {"nofile": 1_048_576, "core": None, "stack": 1 << 30, "nproc": None, "memlock": None}
ALLOWED_LOG_DRIVERS = ("json-file", "local")
MAX_NETWORKS_PER_STACK = 4  # each network takes a subnet from the address pools every rental shares
MAX_SERVICES_PER_STACK = 64  # with replicas: 0 a service runs nothing, but the engine's lists carry it (Swarm)


def policy_violations(model: dict, ctx: SandboxContext) -> list[str]:
    problems: list[str] = []
    services = model.get("services") or {}
    for name in ("models",):
        if model.get(name):
            problems.append(f"{name} is not allowed: it runs programs on the host")
    problems += _top_level(model, ctx)
    if len(services) > MAX_SERVICES_PER_STACK:
        problems.append(f"services: {len(services)} are defined, at most {MAX_SERVICES_PER_STACK} per stack")
    for name, service in services.items():
        problems += [f'service "{name}": {text}' for text in _service(service, set(services), ctx)]
    problems += image_problems(model, ctx.registries)  # the host's engine fetches them on the host's network
    problems += [problem for problem in (published_ports_problem(model), exposed_ports_problem(model)) if problem]
    return problems


def _top_level(model: dict, ctx: SandboxContext) -> list[str]:
    problems = []
    networks = len(model.get("networks") or {})
    if networks > MAX_NETWORKS_PER_STACK:
        problems.append(
            f"networks: {networks} are defined, at most {MAX_NETWORKS_PER_STACK} per stack: each takes a subnet "
            "from the host's Docker address pools, which all rentals share"
        )
    for section in ("networks", "volumes"):
        for key, spec in (model.get(section) or {}).items():
            spec = spec or {}
            where = f'{section[:-1]} "{key}"'
            if spec.get("external"):
                problems.append(f"{where}: external is not allowed: it joins a {section[:-1]} outside the stack")
                continue
            if spec.get("name") not in (None, f"{ctx.project}_{key}"):
                problems.append(f"{where}: name is not allowed: a set name can reach another rental's {section[:-1]}")
            if spec.get("driver") not in (None, "", "bridge" if section == "networks" else "local"):
                problems.append(f"{where}: driver {spec['driver']!r} is not allowed; only the default driver is")
            if spec.get("driver_opts"):
                problems.append(f"{where}: driver_opts is not allowed: it can bind host paths or interfaces")
            if _agent_labels(spec.get("labels")):
                problems.append(f"{where}: labels {', '.join(_agent_labels(spec.get('labels')))} are the agent's own")
            if too_many := file_labels_problem(as_mapping(spec.get("labels")), section[:-1]):
                problems.append(f"{where}: {too_many}")
            if section == "networks":
                problems += network_problems(where, spec)
    if too_many := stack_resources_problem(model):
        problems.append(too_many)
    for section in ("secrets", "configs"):
        for key, spec in (model.get(section) or {}).items():
            spec = spec or {}
            for bad in ("file", "environment", "external"):
                if spec.get(bad):
                    problems.append(f'{section} "{key}": {bad} is not allowed; use content: instead')
    return problems


def _service(service: dict, stack: set[str], ctx: SandboxContext) -> list[str]:
    problems = []
    if service.get("privileged"):
        problems.append("privileged is not allowed: it gives the container the host's devices and kernel")
    for key, why in FORBIDDEN_KEYS.items():
        if service.get(key) not in (None, [], {}, "", False):
            problems.append(f"{key} is not allowed: {why}")
    for key in NAMESPACE_KEYS:
        problem = _namespace(key, service.get(key), stack)
        if problem:
            problems.append(problem)
    for opt in service.get("security_opt") or []:
        if str(opt).strip() not in ALLOWED_SECURITY_OPTS:
            problems.append(f"security_opt {opt!r} is not allowed: it weakens the container's confinement")
    problems += _volumes(service, ctx)
    problems += device_list_mounts(service)
    problems += attachment_problems(service)
    problems += _environment_and_labels(service) + healthcheck_problems(service)
    problems += _resources(service, ctx)
    problems += _gpu_requests(service, ctx)
    if (service.get("oom_score_adj") or 0) < 0:
        problems.append("oom_score_adj below 0 is not allowed: the host's processes would be killed first")
    for source in service.get("volumes_from") or []:
        if str(source).split(":")[0] == "container" or str(source).split(":")[0] not in stack:
            problems.append(f"volumes_from {source!r} is not allowed: only services of this stack")
    logging = service.get("logging") or {}
    if logging.get("driver") not in (None, "", *ALLOWED_LOG_DRIVERS):
        problems.append(f"logging driver {logging['driver']!r} is not allowed: logs stay on the host's json-file/local")
    for hook in (service.get("post_start") or []) + (service.get("pre_stop") or []):
        if isinstance(hook, dict) and hook.get("privileged"):
            problems.append("privileged lifecycle hooks are not allowed")
    return problems


def _namespace(key: str, value: object, stack: set[str]) -> str | None:
    if value in (None, ""):
        return None
    text = str(value)
    kind, _, target = text.partition(":")
    if kind == "service" and target in stack:
        return None  # sharing with a service of the same stack stays inside the sandbox
    if key == "network_mode" and text == "none":
        return None
    if key == "ipc" and text in ("private", "shareable", "none"):
        return None
    if key == "cgroup" and text == "private":
        return None
    return f"{key} {text!r} is not allowed: it shares the namespaces of the host or of containers outside the stack"


def _volumes(service: dict, ctx: SandboxContext) -> list[str]:
    problems = []
    for mount in service.get("volumes") or []:
        kind = mount.get("type") if isinstance(mount, dict) else "bind"
        if kind == "bind":
            source = shown_path(str(mount.get("source") if isinstance(mount, dict) else mount), ctx)
            problems.append(f"volumes: bind mount of the host path {source!r} is not allowed; use a named volume")
        elif kind not in ("volume", "tmpfs"):
            problems.append(f"volumes: mount type {kind!r} is not allowed")
        elif problem := _subpath_problem(mount):
            problems.append(problem)
    return problems


def _subpath_problem(mount: dict) -> str | None:
    """A volume's `subpath` stays inside the volume: an absolute one, or one
    with a `..` component once `.` and `//` are resolved, would climb out of it
    (Docker 26 refuses it at the container's start, 20.10 ignores `subpath`
    and mounts the whole volume); the renter hears it here, before anything runs."""
    subpath = (mount.get("volume") or {}).get("subpath") if isinstance(mount.get("volume"), dict) else None
    if subpath in (None, ""):
        return None
    text = str(subpath)
    if text.startswith("/") or ".." in posixpath.normpath(text).split("/"):
        where = f"volume {mount['source']!r}" if mount.get("source") else "an anonymous volume"
        return (
            f"volumes: subpath {text!r} of {where} is not allowed: "
            "it must be a relative path inside the volume, without '..'"
        )
    return None


def _agent_labels(labels: dict | list | None) -> list[str]:
    return sorted(key for key in as_mapping(labels) if key.startswith(AGENT_LABEL_PREFIXES))


def _environment_and_labels(service: dict) -> list[str]:
    problems = []
    environment = as_mapping(service.get("environment"))
    reserved = sorted(key for key in environment if is_toolkit_variable(key) and key not in PASSED_VARIABLES)
    reserved = [key for key in reserved if not key.startswith("NVIDIA_REQUIRE_")]
    if reserved:
        problems.append(
            f"environment {', '.join(reserved)} is not allowed: the NVIDIA runtime takes GPUs "
            "from these; ask for GPUs with deploy.resources.reservations.devices"
        )
    capabilities = {part.strip() for part in str(environment.get("NVIDIA_DRIVER_CAPABILITIES") or "").split(",")}
    unknown = sorted(capabilities - DRIVER_CAPABILITY_VALUES - {""})
    if unknown:
        problems.append(f"environment NVIDIA_DRIVER_CAPABILITIES {', '.join(unknown)} is not a driver capability")
    if _agent_labels(service.get("labels")):
        problems.append(f"labels {', '.join(_agent_labels(service.get('labels')))} are the agent's own")
    if too_many := file_labels_problem(as_mapping(service.get("labels"))):
        problems.append(too_many)
    return problems


def to_bytes(value: Any) -> int | None:
    """Compose gives sizes as byte counts, as numbers or numeric strings."""
    if value in (None, ""):
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _resources(service: dict, ctx: SandboxContext) -> list[str]:
    problems = []
    limits = ((service.get("deploy") or {}).get("resources") or {}).get("limits") or {}
    memory_share = f"the rental's share of {ctx.memory_bytes / 1024**3:.1f} GiB"
    for key, value in (
        ("mem_limit", service.get("mem_limit")),
        ("deploy.resources.limits.memory", limits.get("memory")),
        ("shm_size", service.get("shm_size")),
        ("memswap_limit", service.get("memswap_limit")),
    ):
        size = to_bytes(value)
        if value not in (None, "") and (size is None or size < 0 or size > ctx.memory_bytes):
            problems.append(f"{key} {value} is beyond {memory_share}")
    for key, value in (("cpus", service.get("cpus")), ("deploy.resources.limits.cpus", limits.get("cpus"))):
        if value not in (None, "", 0) and not 0 < float(value) <= ctx.cpus:
            problems.append(f"{key} {value} is beyond the rental's share of {ctx.cpus:g} CPUs")
    for key, value in (("pids_limit", service.get("pids_limit")), ("deploy.resources.limits.pids", limits.get("pids"))):
        if value not in (None, 0) and not 0 < int(value) <= ctx.pids_limit:
            problems.append(f"{key} {value} is beyond the limit of {ctx.pids_limit} processes")
    for name, value in (service.get("ulimits") or {}).items():
        numbers = [value] if not isinstance(value, dict) else [value.get("soft"), value.get("hard")]
        ceiling = {"nproc": ctx.pids_limit, "memlock": ctx.memory_bytes}.get(name, ULIMIT_CEILINGS.get(name, 0))
        if name not in ULIMIT_CEILINGS:
            problems.append(f"ulimits {name} is not allowed")
        elif ceiling is not None and any(n is None or int(n) < 0 or int(n) > ceiling for n in numbers):
            problems.append(f"ulimits {name} {value} is beyond the sandbox's ceiling of {ceiling}")
    return problems


def flat_capabilities(items: list) -> list[str]:
    """Compose writes capabilities as a list, or (in older files) a list of lists."""
    return [str(x) for item in items for x in (item if isinstance(item, list) else [item])]


RESERVATIONS_KEY = "deploy.resources.reservations.devices"


def gpu_requests(service: dict, *, spelled: bool = False) -> list:
    """The service's GPU asks, in both of Compose's spellings (with spelled=True,
    as (key, request) pairs, for messages that name the key the renter wrote)."""
    reservations = ((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}
    pairs = [(RESERVATIONS_KEY, r) for r in reservations.get("devices") or []] + [
        ("gpus", r) for r in service.get("gpus") or []
    ]
    return pairs if spelled else [request for _, request in pairs]


def _gpu_requests(service: dict, ctx: SandboxContext) -> list[str]:
    problems = []
    requests = gpu_requests(service, spelled=True)
    for key, request in requests:
        capabilities = set(flat_capabilities(request.get("capabilities") or ["gpu"]))
        if "gpu" not in capabilities or capabilities - NVIDIA_CAPABILITIES:
            problems.append(f"{key} capabilities {sorted(capabilities)} are not allowed: only GPUs")
        if request.get("driver") not in (None, "", "nvidia"):
            problems.append(f"{key} driver {request['driver']!r} is not allowed: GPUs come through nvidia")
        if request.get("options"):
            problems.append(f"{key} options are not allowed")
        count = request.get("count")
        if count not in (None, -1, "all") and (not str(count).isdigit() or int(count) > len(ctx.gpu_uuids)):
            problems.append(f"{key}: count {count} is more than the rental's {len(ctx.gpu_uuids)} GPU(s)")
        for device in request.get("device_ids") or []:
            if device not in ctx.gpu_uuids and not (str(device).isdigit() and int(device) < len(ctx.gpu_uuids)):
                problems.append(
                    f"{key}: device {device!r} is not one of the rental's GPUs "
                    f"(use 0 to {len(ctx.gpu_uuids) - 1}, or count)"
                    if ctx.gpu_uuids
                    else f"{key}: device {device!r} is not one of the rental's GPUs (it has none)"
                )
    if requests and not ctx.gpu_uuids and not problems:
        problems.append(f"{requests[0][0]}: the rental has no GPUs; rent GPUs to run services that ask for them")
    return problems

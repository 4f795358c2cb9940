"""Can this host be rented out safely? Pure checks over a probe, each with a
reason and a fix a host can act on.

The minimums belong to the marketplace (sent in the session reply as
`requirements`, shaped in protocol/requirements.py); its defaults are used
until it has spoken, and by `gpuhost-agent doctor` when run offline, so no
sentence here says "the marketplace needs": a minimum is "the required" one,
whoever set it.

A check that cannot apply is skipped, with the reason, rather than passed or
failed: with no GPU there are no models to compare and no memory errors to
read, without a driver no driver or CUDA version, without the toolkit no
toolkit setting. So one missing driver fails one check (`nvidia-gpu`), and
a skipped check never counts against compliance (`ok` stays true).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuhost_agent.inventory import gpu_delivery
from gpuhost_agent.protocol.requirements import TOOLKIT_SAFE_VERSION, Requirements, older_than, version_tuple

TOOLKIT_CVES = "CVE-2024-0132, CVE-2025-23359, CVE-2025-23266"
GIB = 1024**3


@dataclass(frozen=True)
class Check:
    id: str
    ok: bool
    summary: str
    remedy: str = ""
    skipped: bool = False  # could not apply to this machine; `summary` says why

    def as_wire(self) -> dict:
        return {"id": self.id, "ok": self.ok, "skipped": self.skipped, "summary": self.summary, "remedy": self.remedy}


def at_least(found: str | None, minimum: str) -> bool:
    return bool(version_tuple(found)) and version_tuple(found) >= version_tuple(minimum)


def _check(id_: str, ok: bool, good: str, bad: str, remedy: str) -> Check:
    return Check(id_, ok, good if ok else bad, "" if ok else remedy)


def _skip(id_: str, reason: str) -> Check:
    return Check(id_, True, f"skipped: {reason}", "", skipped=True)


def _version_check(id_: str, what: str, found: str | None, minimum: str, remedy: str) -> Check:
    """`what found` when at least `minimum`, else the one sentence install.sh says too."""
    if not version_tuple(found):
        return Check(id_, False, f"{what}: version unknown; {minimum} or newer is required", remedy)
    return _check(id_, at_least(found, minimum), f"{what} {found}", older_than(what, str(found), minimum), remedy)


def evaluate(system_data: Mapping[str, Any], req: Requirements, clock_skew_seconds: float | None = None) -> list[Check]:
    nvml, host = system_data["nvml"], system_data["host"]
    gpus = [gpu for gpu in nvml["gpus"] if not gpu.get("error")]
    checks = [
        _check(
            "nvidia-gpu",
            nvml["available"] and bool(gpus),
            f"{len(gpus)} NVIDIA GPU(s) found through NVML",
            f"no NVIDIA GPU usable: {nvml.get('error') or 'NVML lists no GPU'}",
            "install the NVIDIA driver and check that `nvidia-smi` lists the GPUs",
        ),
        *_driver_checks(nvml, req),
        *_gpu_checks(gpus),
        *_toolkit_checks(host["nvidiaContainerToolkit"], req, host["docker"]),
        *_docker_checks(host["docker"], host["compose"], host["nvidiaContainerToolkit"], req),
        _disk_check(host["storage"], req),
        *_clock_checks(host["clock"], clock_skew_seconds, req),
        _egress_check(host.get("egress")),
        _pull_guard_check(host.get("pullGuard"), host["docker"]),
    ]
    return checks


EGRESS_CHECK = "container-egress-confined"


def _egress_check(egress: dict | None) -> Check:
    """A rental's containers reach the internet and their own stack, not the
    host, its networks or the cloud's metadata service (runtime/egress_rules.py)."""
    if not isinstance(egress, dict):
        return _skip(EGRESS_CHECK, "the probe did not read the host's firewall")
    unconfined = egress.get("unconfinedNetworks") or []
    if egress.get("confined") is True and unconfined:
        return Check(
            EGRESS_CHECK,
            False,
            f"{len(unconfined)} network(s) of stacks deployed before the egress rules are outside them "
            f"({', '.join(map(str, unconfined))}): their containers can reach the host, its networks and the "
            "cloud's metadata service",
            "deploy those stacks again (remove, then deploy): the agent makes their networks anew, within the rules",
        )
    if egress.get("confined") is True:
        return Check(EGRESS_CHECK, True, "a rental's containers reach the internet and their own stack only")
    if egress.get("differs"):
        return Check(
            EGRESS_CHECK,
            False,
            f"the agent's egress rules are not in place ({egress['differs']}): a rental's containers can reach "
            "the host, its networks and the cloud's metadata service",
            "start the agent (systemctl start gpuhost-agent): it writes them at start and puts them back every "
            "minute; a firewall reload that flushes all chains (ufw, firewalld) removes them until then",
        )
    error = egress.get("error") or "unknown"
    if egress.get("confined") is None:
        return Check(EGRESS_CHECK, False, f"cannot read the host's firewall: {error}", "run doctor as root")
    return Check(EGRESS_CHECK, False, error, "install iptables (apt install iptables) and restart the agent")


PULL_GUARD_CHECK = "registry-pulls-guarded"
FENCE_GROUP = "gpuhost-engine"  # runtime/egress_rules.ENGINE_GROUP: install.sh makes it, Docker's drop-in names it


def _pull_guard_check(guard: dict | None, docker: dict) -> Check:
    """dockerd's pulls go through the agent's pull guard (streams/pull_guard.py),
    so a registry name that answers the host's address when dockerd pulls, or
    a redirect there, reaches nothing of the host's."""
    if not isinstance(guard, dict):
        return _skip(PULL_GUARD_CHECK, "the probe did not look at the pull guard")
    if not docker.get("available"):
        return _skip(PULL_GUARD_CHECK, "Docker Engine unreachable")
    risk = "a renter's registry name that answers the host's address when dockerd pulls reaches the host"
    listen = guard.get("listen")
    if not listen:
        return Check(
            PULL_GUARD_CHECK,
            False,
            f"the pull guard is off (GPUHOST_PULL_GUARD=off): {risk}",
            "remove GPUHOST_PULL_GUARD=off, restart the agent and run install.sh again",
        )
    if guard.get("error"):
        return Check(
            PULL_GUARD_CHECK,
            False,
            f"the pull guard does not answer on {listen} ({guard['error']}): dockerd's pulls fail",
            "see the agent's log (pull_guard_not_listening): free the port or set GPUHOST_PULL_GUARD to another "
            "loopback address, then run install.sh again so that Docker's proxy names it",
        )
    want = f"http://{listen}"
    proxies = docker.get("proxies") or {}
    astray = [f"{name.upper()} proxy {proxies.get(name) or 'none'}" for name in ("http", "https")
              if str(proxies.get(name) or "").rstrip("/") != want]  # fmt: skip
    around = [entry for entry in str(proxies.get("no") or "").replace(" ", ",").split(",") if _around_guard(entry)]
    if around:
        astray.append(f"NO_PROXY sends {', '.join(around[:5])} around it")
    fence = docker.get("fence") or {}
    if fence.get("group") is None:
        astray.append(f"no group {FENCE_GROUP} for the engine fence")
    elif fence.get("dockerd") is not True:
        detail = f": {fence['detail']}" if fence.get("detail") else ""
        astray.append(f"dockerd is not in the group {FENCE_GROUP}{detail}")
    if astray:
        return Check(
            PULL_GUARD_CHECK,
            False,
            f"dockerd's pulls do not go through the pull guard ({', '.join(astray)}): {risk}",
            "install.sh makes the group and writes Docker's drop-ins; restart Docker to take them "
            "(systemctl restart docker: it restarts "
            f"the host's containers). A proxy in daemon.json wins over the drop-in: set its proxies to {want} and "
            "GPUHOST_PULL_GUARD_UPSTREAM to the proxy it named",
        )
    return Check(PULL_GUARD_CHECK, True, f"dockerd's pulls go through the pull guard on {listen}")


def _around_guard(entry: str) -> bool:
    """Whether a NO_PROXY entry sends some pull around the guard: any but the
    loopback names (which Go never proxies anyway, and the fence holds)."""
    entry = entry.strip().strip("[]")
    if not entry or entry.lower() == "localhost":
        return False
    try:
        return not ipaddress.ip_network(entry, strict=False).is_loopback
    except ValueError:
        return True


def _driver_checks(nvml: dict, req: Requirements) -> list[Check]:
    if not nvml["available"]:
        no_driver = "no NVIDIA driver answers (see nvidia-gpu)"
        return [_skip("driver-version", no_driver), _skip("cuda-version", no_driver)]
    return [
        _version_check(
            "driver-version",
            "NVIDIA driver",
            nvml.get("driverVersion"),
            req.minDriverVersion,
            f"install NVIDIA driver {req.minDriverVersion} or newer",
        ),
        _version_check(
            "cuda-version",
            "the driver's CUDA",
            nvml.get("cudaDriverVersion"),
            req.minCudaVersion,
            f"install a driver that supports CUDA {req.minCudaVersion} or newer",
        ),
    ]


def _gpu_checks(gpus: list[dict]) -> list[Check]:
    if not gpus:
        return [
            _skip("gpu-models", "no GPU, so no models to compare"),
            _skip("gpu-memory-errors", "no GPU, so no memory errors to read"),
        ]
    names = sorted({gpu.get("name") or "unknown" for gpu in gpus})
    bad_ecc = [str(gpu["index"]) for gpu in gpus if (gpu.get("eccUncorrectedErrors") or 0) > 0]
    return [
        _check(
            "gpu-models",
            len(names) <= 1,
            "all GPUs are the same model",
            f"GPUs of mixed models: {', '.join(names)}",
            "list one model per environment: move the other GPUs to their own machine",
        ),
        _check(
            "gpu-memory-errors",
            not bad_ecc,
            "no uncorrected GPU memory errors",
            f"uncorrected ECC memory errors on GPU {', '.join(bad_ecc)}",
            "reset the GPU (nvidia-smi -r) or have it serviced before renting it out",
        ),
    ]


def _toolkit_checks(kit: dict, req: Requirements, docker: dict) -> list[Check]:
    """The toolkit where it is installed. Where dockerd gives GPUs by a CDI spec
    (the agent's own, inventory/driver_cdi.py) no toolkit is needed, and none is
    better: no root hook reads what a renter's image sets; but an
    nvidia runtime registered in Docker is a toolkit the agent did not find,
    whose version it cannot check."""
    delivery = docker.get("gpuDelivery") or {}
    runtime = "nvidia" in (docker.get("runtimes") or ()) or docker.get("defaultRuntime") == "nvidia"
    if not kit["installed"] and runtime:
        return [
            Check(
                "container-toolkit",
                False,
                "an nvidia runtime is registered in Docker, but no NVIDIA Container Toolkit is where the agent "
                "looks (PATH, /usr/bin, /usr/local/bin, /usr/sbin): its version cannot be checked",
                "remove the nvidia runtime from /etc/docker/daemon.json where GPUs reach containers by CDI, "
                "or put the toolkit's binaries on PATH",
            ),
            _skip("toolkit-visible-devices", "no NVIDIA Container Toolkit found, so no setting of it to read"),
        ]
    if not kit["installed"] and delivery.get("method") == gpu_delivery.CDI:
        return [
            Check(
                "container-toolkit",
                True,
                f"NVIDIA Container Toolkit not installed, and not needed: GPUs reach containers by CDI, "
                f"no hook ({delivery.get('detail')})",
                "",
            ),
            _skip("toolkit-visible-devices", "no NVIDIA Container Toolkit, so no setting of it to read"),
        ]
    if not kit["installed"]:
        return [
            Check(
                "container-toolkit",
                False,
                "NVIDIA Container Toolkit not installed",
                "install nvidia-container-toolkit (see NVIDIA's install guide) and configure Docker with nvidia-ctk",
            ),
            _skip("toolkit-visible-devices", "no NVIDIA Container Toolkit, so no setting of it to read"),
        ]
    version = kit.get("version")
    minimum = max(req.minContainerToolkitVersion, TOOLKIT_SAFE_VERSION, key=version_tuple)
    toolkit = _version_check(
        "container-toolkit",
        "NVIDIA Container Toolkit",
        version,
        minimum,
        f"upgrade nvidia-container-toolkit to {minimum} or newer",
    )
    if not at_least(version, TOOLKIT_SAFE_VERSION):
        toolkit = Check(
            toolkit.id, False, f"{toolkit.summary}, open to container escapes {TOOLKIT_CVES}", toolkit.remedy
        )
    return [
        toolkit,
        _visible_devices_check(kit),
    ]


def _visible_devices_check(kit: dict) -> Check:
    """No container picks its own GPUs: the toolkit ignores NVIDIA_VISIBLE_DEVICES
    from unprivileged containers, and device lists written as mounts onto
    /var/run/nvidia-container-devices (read before the variable)."""
    bad, keys = [], []
    if kit.get("acceptsEnvvarFromUnprivileged", True):
        bad.append("lets any container pick GPUs through NVIDIA_VISIBLE_DEVICES")
        keys.append("accept-nvidia-visible-devices-envvar-when-unprivileged")
    if kit.get("acceptsDeviceListAsVolumeMounts"):
        bad.append("gives a container the GPUs named by its mounts onto /var/run/nvidia-container-devices")
        keys.append("accept-nvidia-visible-devices-as-volume-mounts")
    return _check(
        "toolkit-visible-devices",
        not bad,
        "the toolkit ignores NVIDIA_VISIBLE_DEVICES and device mounts from unprivileged containers",
        f"the toolkit {' and '.join(bad)}, so a renter could reach GPUs rented to someone else",
        f"set {' and '.join(f'{key} = false' for key in keys)} in {kit.get('configPath')} and restart Docker",
    )


def _docker_checks(docker: dict, compose: dict, kit: dict, req: Requirements) -> list[Check]:
    docker_remedy = f"install or start Docker Engine {req.minDockerVersion} or newer (systemctl status docker)"
    compose_remedy = "install Docker's compose plugin: apt install docker-compose-plugin"
    gpu_containers = docker.get("gpuContainers") or {}
    return [
        _version_check("docker", "Docker Engine", docker.get("version"), req.minDockerVersion, docker_remedy)
        if docker["available"]
        else Check("docker", False, f"Docker Engine unreachable: {docker.get('error')}", docker_remedy),
        _version_check("compose", "Docker Compose", compose.get("version"), req.minComposeVersion, compose_remedy)
        if compose["available"]
        else Check("compose", False, f"Docker Compose unavailable: {compose.get('error')}", compose_remedy),
        _gpu_containers_check(gpu_containers, docker.get("gpuDelivery") or {}, docker["available"], kit["installed"]),
        *_swarm_node_checks(docker),
    ]


def _swarm_node_checks(docker: dict) -> list[Check]:
    """What a Swarm service cannot ask for (core/swarm/stack_file.py), the engine
    of a Swarm node must give every container itself: no-new-privileges, and a
    cgroup namespace of its own (on cgroup v1 the default is the host's). On a
    machine of its own the agent sets both on each container: nothing to check."""
    return [
        _swarm_default(
            docker,
            ("swarm-no-new-privileges", "noNewPrivileges", "no-new-privileges"),
            "a renter's process could gain privileges through a setuid program",
            '"no-new-privileges": true',
        ),
        _swarm_default(
            docker,
            ("swarm-cgroupns", "cgroupnsPrivate", "a cgroup namespace of its own"),
            "a renter's container would read the host's cgroup tree",
            '"default-cgroupns-mode": "private"',
        ),
    ]


def _swarm_default(docker: dict, names: tuple[str, str, str], risk: str, setting: str) -> Check:
    """names: (the check's id, the probe's fact, what every container gets)."""
    check_id, fact, what = names
    if not docker["available"]:
        return _skip(check_id, "Docker Engine unreachable")
    if (docker.get("swarm") or {}).get("state") != "active":
        return _skip(check_id, f"not a Swarm node: the agent gives each container {what}")
    held = docker.get(fact) or {}
    remedy = f"set {setting} in /etc/docker/daemon.json and restart Docker"
    unknown = f"cannot tell whether this Swarm node's dockerd gives containers {what}: {held.get('detail')}"
    if held.get("default") is None:
        return Check(check_id, False, unknown, remedy)
    return _check(
        check_id,
        held["default"] is True,
        f"this Swarm node's dockerd gives every container {what} ({held.get('detail')})",
        f"this Swarm node's dockerd does not give containers {what}, and Swarm services cannot ask for it: {risk}",
        remedy,
    )


def _gpu_containers_check(gpu_containers: dict, delivery: dict, docker_up: bool, toolkit_installed: bool) -> Check:
    """Whether Docker gives containers GPUs, and which way (CDI or the runtime
    hook: inventory/gpu_delivery.py). With no engine, or no toolkit to
    configure it with, the failure is already counted by those checks (one
    missing piece fails once), and the fix starts there."""
    if not gpu_containers.get("ok") and not docker_up:
        return _skip("gpu-containers", "Docker Engine unreachable, so no GPU container to start")
    by_cdi = delivery.get("method") == gpu_delivery.CDI
    if by_cdi and gpu_containers.get("method") == "engine-info":
        # The spec dockerd reads is the way in, whoever wrote it (the signs look for the toolkit's files).
        return Check("gpu-containers", True, f"Docker can give GPUs to containers by CDI: {delivery.get('detail')}", "")
    if not gpu_containers.get("ok") and not toolkit_installed and not by_cdi:
        return _skip("gpu-containers", "no NVIDIA Container Toolkit yet to give containers GPUs")
    # The signs alone (no check container) may be a CDI spec dockerd does not read: no way in.
    no_way = gpu_containers.get("method") == "engine-info" and delivery.get("method") == "none"
    way = f"; GPUs reach them through {delivery['method']}: {delivery.get('detail')}" if delivery.get("method") else ""
    return _check(
        "gpu-containers",
        bool(gpu_containers.get("ok")) and not no_way,
        f"Docker can give GPUs to containers ({gpu_containers.get('detail') or gpu_containers.get('method')}){way}",
        f"Docker cannot start GPU containers: {delivery.get('detail') if no_way else gpu_containers.get('detail')}",
        "configure Docker for the toolkit: nvidia-ctk runtime configure --runtime=docker && systemctl restart docker",
    )


def _disk_check(storage: dict, req: Requirements) -> Check:
    free, path = storage.get("freeBytes"), storage.get("path")
    remedy = "free space (docker system prune) or move Docker's data-root to a larger disk"
    if free is None:
        return Check(
            "disk-space",
            False,
            f"cannot tell the free space on {path} (Docker's data root): {storage.get('error') or 'unknown'}",
            remedy,
        )
    return _check(
        "disk-space",
        free >= req.minFreeDiskGiB * GIB,
        f"{free / GIB:.1f} GiB free for containers on {path}",
        f"only {free / GIB:.1f} GiB free on {path} (Docker's data root), less than the required "
        f"{req.minFreeDiskGiB:g} GiB",
        remedy,
    )


def _clock_checks(clock: dict, skew: float | None, req: Requirements) -> list[Check]:
    checks = [
        _check(
            "clock-sync",
            clock.get("synchronized") is True,
            "system clock synchronised (NTP)",
            "system clock not synchronised"
            if clock.get("synchronized") is False
            else "cannot tell whether the system clock is synchronised",
            "enable time synchronisation: timedatectl set-ntp true (or install chrony)",
        )
    ]
    if skew is not None:  # known only once a marketplace has answered
        checks.append(
            _check(
                "clock-skew",
                abs(skew) <= req.maxClockSkewSeconds,
                f"clock within {abs(skew):.1f} s of the marketplace",
                f"clock is {skew:+.1f} s off the marketplace's (at most {req.maxClockSkewSeconds:g} s)",
                "enable time synchronisation: timedatectl set-ntp true (or install chrony)",
            )
        )
    return checks


def summary(checks: list[Check]) -> tuple[bool, str]:
    """(isCompliant, failedComplianceReason) for the Environment; skipped checks are not failures."""
    failed = [check.summary for check in checks if not check.ok]
    return not failed, "; ".join(failed)

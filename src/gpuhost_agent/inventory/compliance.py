"""Can this host be rented out safely? Pure checks over a probe, each with a
reason and a fix a host can act on.

The minimums belong to the marketplace (sent in the session reply as
`requirements`, shaped in protocol/requirements.py); its defaults are used
until it has spoken, and by `gpuhost-agent doctor` when run offline.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost_agent.protocol.requirements import TOOLKIT_SAFE_VERSION, Requirements, version_tuple

TOOLKIT_CVES = "CVE-2024-0132, CVE-2025-23359, CVE-2025-23266"
GIB = 1024**3


@dataclass(frozen=True)
class Check:
    id: str
    ok: bool
    summary: str
    remedy: str = ""

    def as_wire(self) -> dict:
        return {"id": self.id, "ok": self.ok, "summary": self.summary, "remedy": self.remedy}


def at_least(found: str | None, minimum: str) -> bool:
    return bool(version_tuple(found)) and version_tuple(found) >= version_tuple(minimum)


def _check(id_: str, ok: bool, good: str, bad: str, remedy: str) -> Check:
    return Check(id_, ok, good if ok else bad, "" if ok else remedy)


def evaluate(system_data: dict, req: Requirements, clock_skew_seconds: float | None = None) -> list[Check]:
    nvml, host = system_data["nvml"], system_data["host"]
    gpus = [gpu for gpu in nvml["gpus"] if not gpu.get("error")]
    docker, compose, kit = host["docker"], host["compose"], host["nvidiaContainerToolkit"]
    checks = [
        _check(
            "nvidia-gpu",
            nvml["available"] and bool(gpus),
            f"{len(gpus)} NVIDIA GPU(s) found through NVML",
            f"no NVIDIA GPU usable: {nvml.get('error') or 'NVML lists no GPU'}",
            "install the NVIDIA driver and check that `nvidia-smi` lists the GPUs",
        ),
        _check(
            "driver-version",
            at_least(nvml.get("driverVersion"), req.minDriverVersion),
            f"NVIDIA driver {nvml.get('driverVersion')}",
            f"NVIDIA driver {nvml.get('driverVersion') or 'missing'} is older than the required {req.minDriverVersion}",
            f"install NVIDIA driver {req.minDriverVersion} or newer",
        ),
        _check(
            "cuda-version",
            at_least(nvml.get("cudaDriverVersion"), req.minCudaVersion),
            f"driver supports CUDA {nvml.get('cudaDriverVersion')}",
            f"driver supports CUDA {nvml.get('cudaDriverVersion') or 'unknown'},"
            f" the marketplace needs {req.minCudaVersion}",
            f"install a driver that supports CUDA {req.minCudaVersion} or newer",
        ),
    ]
    names = sorted({gpu.get("name") or "unknown" for gpu in gpus})
    checks.append(
        _check(
            "gpu-models",
            len(names) <= 1,
            "all GPUs are the same model",
            f"GPUs of mixed models: {', '.join(names)}",
            "list one model per environment: move the other GPUs to their own machine",
        )
    )
    bad_ecc = [str(gpu["index"]) for gpu in gpus if (gpu.get("eccUncorrectedErrors") or 0) > 0]
    checks.append(
        _check(
            "gpu-memory-errors",
            not bad_ecc,
            "no uncorrected GPU memory errors",
            f"uncorrected ECC memory errors on GPU {', '.join(bad_ecc)}",
            "reset the GPU (nvidia-smi -r) or have it serviced before renting it out",
        )
    )
    checks.extend(_toolkit_checks(kit, req))
    docker_problem = (
        f"Docker Engine unreachable: {docker.get('error')}"
        if not docker["available"]
        else f"Docker Engine {docker.get('version')} is older than {req.minDockerVersion}"
    )
    checks.append(
        _check(
            "docker",
            docker["available"] and at_least(docker.get("version"), req.minDockerVersion),
            f"Docker Engine {docker.get('version')}",
            docker_problem,
            f"install or start Docker Engine {req.minDockerVersion} or newer (systemctl status docker)",
        )
    )
    checks.append(
        _check(
            "compose",
            compose["available"] and at_least(compose.get("version"), req.minComposeVersion),
            f"Docker Compose {compose.get('version')}",
            f"Docker Compose {compose.get('version') or 'missing'}; {req.minComposeVersion} or newer is needed",
            "install Docker's compose plugin: apt install docker-compose-plugin",
        )
    )
    gpu_containers = docker.get("gpuContainers") or {}
    checks.append(
        _check(
            "gpu-containers",
            bool(gpu_containers.get("ok")),
            f"Docker can give GPUs to containers ({gpu_containers.get('detail') or gpu_containers.get('method')})",
            f"Docker cannot start GPU containers: {gpu_containers.get('detail')}",
            "configure Docker for the toolkit:"
            " nvidia-ctk runtime configure --runtime=docker && systemctl restart docker",
        )
    )
    checks.append(_disk_check(host["storage"], req))
    checks.extend(_clock_checks(host["clock"], clock_skew_seconds, req))
    return checks


def _toolkit_checks(kit: dict, req: Requirements) -> list[Check]:
    if not kit["installed"]:
        return [
            Check(
                "container-toolkit",
                False,
                "NVIDIA Container Toolkit not installed",
                "install nvidia-container-toolkit (see NVIDIA's install guide) and configure Docker with nvidia-ctk",
            )
        ]
    version = kit.get("version")
    minimum = max(req.minContainerToolkitVersion, TOOLKIT_SAFE_VERSION, key=version_tuple)
    unsafe = kit.get("acceptsEnvvarFromUnprivileged", True)
    return [
        _check(
            "container-toolkit",
            at_least(version, minimum),
            f"NVIDIA Container Toolkit {version}",
            f"NVIDIA Container Toolkit {version or '(version unknown)'} is older than {minimum}"
            + (f", open to container escapes {TOOLKIT_CVES}" if not at_least(version, TOOLKIT_SAFE_VERSION) else ""),
            f"upgrade nvidia-container-toolkit to {minimum} or newer",
        ),
        _check(
            "toolkit-visible-devices",
            not unsafe,
            "the toolkit ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers",
            "the toolkit lets any container pick GPUs through NVIDIA_VISIBLE_DEVICES, so a renter could reach "
            "GPUs rented to someone else",
            f"set accept-nvidia-visible-devices-envvar-when-unprivileged = false in {kit.get('configPath')}"
            " and restart Docker",
        ),
    ]


def _disk_check(storage: dict, req: Requirements) -> Check:
    free = storage.get("freeBytes")
    ok = free is not None and free >= req.minFreeDiskGiB * GIB
    shown = "unknown" if free is None else f"{free / GIB:.1f} GiB"
    return _check(
        "disk-space",
        ok,
        f"{shown} free for containers on {storage.get('path')}",
        f"only {shown} free on {storage.get('path')} (Docker's data root), {req.minFreeDiskGiB:g} GiB needed",
        "free space (docker system prune) or move Docker's data-root to a larger disk",
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
    if skew is not None:
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
    """(isCompliant, failedComplianceReason) for the Environment."""
    failed = [check.summary for check in checks if not check.ok]
    return not failed, "; ".join(failed)

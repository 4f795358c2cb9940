"""Probe and doctor output for people: short aligned lines, units spelt out,
every unknown shown as such rather than left out."""

from __future__ import annotations

GIB = 1024**3


def _show(value: object, unit: str = "") -> str:
    if value is None or value == "":
        return "unknown"
    return f"{value}{(' ' + unit) if unit else ''}"


def _gib(value: float | None) -> str:
    return "unknown" if value is None else f"{value / GIB:.1f} GiB"


def probe_table(report: dict) -> str:
    data, listing = report["systemData"], report["listing"]
    nvml, host = data["nvml"], data["host"]
    docker, compose, kit = host["docker"], host["compose"], host["nvidiaContainerToolkit"]
    rows = [
        (
            "Host",
            f"{data['hostname']} ({_show(host['os']['name'])}, kernel {host['os']['kernel']}, {host['os']['arch']})",
        ),
        (
            "CPU",
            f"{_show(host['cpu']['model'])}: {host['cpu']['physicalCores']} cores, "
            f"{host['cpu']['logicalCores']} logical CPUs",
        ),
        ("Memory", _gib(host["memory"]["totalBytes"])),
        (
            "Storage",
            f"{_gib(host['storage']['totalBytes'])} total, {_gib(host['storage']['freeBytes'])} free "
            f"on {host['storage']['path']} (Docker's data root)",
        ),
        ("Docker Engine", _show(docker.get("version")) if docker["available"] else f"unavailable: {docker['error']}"),
        (
            "Docker Compose",
            _show(compose.get("version")) if compose["available"] else f"unavailable: {compose['error']}",
        ),
        (
            "Container Toolkit",
            f"{_show(kit['version'])} ({', '.join(kit['binaries'])})" if kit["installed"] else "not installed",
        ),
        (
            "GPU containers",
            f"{'yes' if docker['gpuContainers'].get('ok') else 'no'}: "
            f"{_show(docker['gpuContainers'].get('detail'))} ({docker['gpuContainers'].get('method')})",
        ),
        ("GPU delivery", _delivery(docker.get("gpuDelivery") or {})),
        ("Agent's CDI spec", _agent_spec(docker.get("cdiSpec"))),
        ("Swarm", _swarm(docker)),
        ("Disk quota", _quota(docker.get("storageQuota") or {})),
        ("Rental limits", _rental_limits(docker.get("rentalLimits") or {})),
        ("Clock", {True: "synchronised", False: "NOT synchronised", None: "unknown"}[host["clock"]["synchronized"]]),
        (
            "NVIDIA driver",
            f"{_show(nvml['driverVersion'])}, CUDA {_show(nvml['cudaDriverVersion'])}"
            if nvml["available"]
            else f"unavailable: {nvml['error']}",
        ),
    ]
    lines = [f"{name:<18} {value}" for name, value in rows]
    for gpu in nvml["gpus"]:
        lines.append("")
        lines.extend(_gpu_lines(gpu))
    lines.append("")
    lines.append("Listing fields")
    units = {
        "gpuVRAM": "GiB",
        "gpuBandwidth": "GB/s",
        "totalRAM": "GiB",
        "totalStorage": "GiB",
        "networkUploadSpeed": "Mbit/s",
        "networkDownloadSpeed": "Mbit/s",
    }
    for key, value in listing.items():
        lines.append(f"  {key:<21} {_show(value, units.get(key, ''))}")
    return "\n".join(lines)


def _gpu_lines(gpu: dict) -> list[str]:
    if gpu.get("error"):
        return [f"GPU {gpu['index']}: cannot be read: {gpu['error']}"]
    pcie = gpu["pcie"]
    mig, ecc = gpu["migMode"], gpu["eccMode"]
    lines = [
        f"GPU {gpu['index']}: {_show(gpu['name'])}  {_show(gpu['uuid'])}  bus {_show(gpu['pciBusId'])}",
        f"  memory {_gib(gpu['memoryTotalBytes'])}, {_show(gpu['memoryBusWidthBits'], 'bit')} bus, "
        f"max {_show(gpu['maxMemoryClockMHz'], 'MHz')} -> {_show(gpu['memoryBandwidthGBps'], 'GB/s')}",
        f"  PCIe gen {_show(pcie['genCurrent'])}/{_show(pcie['genMax'])} (current/max), "
        f"x{_show(pcie['widthCurrent'])}/x{_show(pcie['widthMax'])}; NVLink links up: {_show(gpu['nvlinkLinksUp'])}",
        f"  compute capability {_show(gpu['computeCapability'])}; MIG {_onoff(mig)}; ECC {_onoff(ecc)}, "
        f"uncorrected errors {_show(gpu['eccUncorrectedErrors'])}; power limit {_show(gpu['powerLimitW'], 'W')}",
    ]
    if gpu["unsupported"]:
        lines.append(
            "  not reported by NVML: " + ", ".join(f"{k} ({v})" for k, v in sorted(gpu["unsupported"].items()))
        )
    return lines


def _onoff(mode: dict | None) -> str:
    return "unknown" if mode is None else ("on" if mode["current"] else "off")


def doctor_lines(checks: list[dict]) -> str:
    """One line per check, PASS, FAIL or SKIP (a check that cannot apply here,
    the reason in its summary), the fix under each failure."""
    lines = []
    for check in checks:
        verdict = "SKIP" if check.get("skipped") else "PASS" if check["ok"] else "FAIL"
        said = check["summary"].removeprefix("skipped: ") if check.get("skipped") else check["summary"]
        lines.append(f"[{verdict}] {check['id']:<24} {said}")
        if not check["ok"] and check["remedy"]:
            lines.append(f"       {'':<24} fix: {check['remedy']}")
    failed = sum(1 for check in checks if not check["ok"])
    lines.append("")
    lines.append("compliant: this host can be listed" if not failed else f"NOT compliant: {failed} check(s) failed")
    return "\n".join(lines)


def _quota(quota: dict) -> str:
    """Whether each container's writable layer is capped (inventory/storage_quota.py)."""
    if not quota:
        return "unknown"
    return f"{'per container' if quota.get('available') else 'none'}: {quota.get('detail')}"


def _delivery(delivery: dict) -> str:
    """Which way GPUs reach containers (inventory/gpu_delivery.py), and what was found."""
    if not delivery:
        return "unknown"
    return f"{delivery.get('method')}: {delivery.get('detail')}"


def _agent_spec(spec: dict | None) -> str:
    """The agent's own CDI spec (inventory/driver_cdi.py): where it is, or why there is none."""
    if not spec:
        return "not looked at (Docker Engine unreachable)"
    return f"{spec['path']}, {spec['detail']}" if spec.get("path") else str(spec.get("detail"))


def _rental_limits(limits: dict) -> str:
    """Whether all of a rental's containers share its limits, or each has them alone."""
    if not limits:
        return "unknown"
    return f"{'shared by its containers' if limits.get('perRental') else 'per container only'}: {limits.get('detail')}"


def _swarm(docker: dict) -> str:
    """This engine's Swarm membership, and whether it holds no-new-privileges for
    every container (what a Swarm node must do: core/swarm/stack_file.py)."""
    swarm = docker.get("swarm") or {"state": "unknown"}
    held = (docker.get("noNewPrivileges") or {}).get("default")
    role = (
        f", {'manager' if swarm.get('manager') else 'worker'} node {swarm.get('nodeId')}" if swarm.get("nodeId") else ""
    )
    default = {True: "yes", False: "no", None: "unknown"}[held]
    return f"{swarm['state']}{role}; no-new-privileges by default: {default}"

"""One full probe of the machine, and the report the marketplace gets from it:
systemData, the Listing's hardware fields and the compliance verdict.

The probe's parts run concurrently (NVML in a worker thread, the host's
subprocesses and Docker calls side by side); the network speed is measured
elsewhere, on its own slower schedule, and only merged in here.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from gpuhost_agent import __version__
from gpuhost_agent.inventory import compliance, gpu_delivery, listing
from gpuhost_agent.inventory.environment import machines_check
from gpuhost_agent.inventory.host_probe import delivery, probe_host
from gpuhost_agent.inventory.machines import Machines, OneMachine
from gpuhost_agent.inventory.nvml_probe import NvmlProbe
from gpuhost_agent.protocol import wire_time
from gpuhost_agent.protocol.wire_system import HostFacts, NvmlInventory, SystemData, SystemDataReport
from gpuhost_agent.runtime.egress_rules import Opening
from gpuhost_agent.runtime.engine.client import DockerEngine


@dataclass
class Prober:
    """What a probe needs; built once per process."""

    nvml: NvmlProbe
    engine: DockerEngine
    compose_command: list[str] | None = None
    gpu_check_image: str | None = None
    toolkit_config: Path | None = None
    location: str | None = None
    speed: dict | None = field(default=None)
    # The environment's machines: this one alone, or every machine of a Swarm environment.
    machines: Machines = field(default_factory=OneMachine)
    egress_allow: tuple[str, ...] = ()  # GPUHOST_EGRESS_ALLOW: part of the rules the probe compares
    egress_openings: tuple[Opening, ...] = ()  # the engine fence's openings: part of them too
    # GPUHOST_PULL_GUARD, and what asks it whether it answers (streams/pull_guard.answers).
    pull_guard: tuple[str, int] | None = None
    guard_answers: Callable[[str, int], Awaitable[str | None]] | None = None
    # The agent's own CDI spec: kept at each probe by the daemon (inventory/driver_cdi.keep), looked at by
    # `probe` and `doctor` (driver_cdi.look).
    cdi: Callable[[dict, dict], dict] | None = None

    async def system_data(self) -> SystemData:
        nvml, host = await asyncio.gather(
            asyncio.to_thread(self.nvml.inventory),
            probe_host(
                self.engine,
                self.compose_command,
                gpu_check_image=self.gpu_check_image,
                toolkit_config=self.toolkit_config,
                egress_allow=self.egress_allow,
                egress_openings=self.egress_openings,
            ),
        )
        host["pullGuard"] = await self._pull_guard()
        docker = host["docker"]
        if self.cdi is not None and docker.get("available"):
            docker["cdiSpec"] = await asyncio.to_thread(self.cdi, nvml, docker)
            if docker["cdiSpec"]["path"] or docker["gpuDelivery"]["method"] == gpu_delivery.CDI:
                docker["gpuDelivery"] = await asyncio.to_thread(delivery, docker)  # as the spec is now
        data: SystemData = {
            "probedAt": wire_time.iso(),
            "agentVersion": __version__,
            "hostname": socket.gethostname(),
            "nvml": cast(NvmlInventory, nvml),
            "host": cast(HostFacts, host),
            "networkSpeed": self.speed,
            "location": self.location,
        }
        environment = await self.machines.environment(data["host"])
        if environment is not None:
            data["environment"] = environment
        return data

    async def _pull_guard(self) -> dict:
        """Where the pull guard listens, and whether it answers there."""
        if self.pull_guard is None:
            return {"listen": None, "error": None}
        host, port = self.pull_guard
        error = await self.guard_answers(host, port) if self.guard_answers else "not asked"
        return {"listen": f"{host}:{port}", "error": error}

    async def report(
        self, requirements: compliance.Requirements, clock_skew_seconds: float | None = None
    ) -> SystemDataReport:
        data = await self.system_data()
        return build_report(data, requirements, clock_skew_seconds)


def build_report(
    data: SystemData, requirements: compliance.Requirements, clock_skew_seconds: float | None
) -> SystemDataReport:
    checks = compliance.evaluate(data, requirements, clock_skew_seconds)
    machines = machines_check(data, requirements)
    if machines is not None:
        checks.append(machines)
    ok, reason = compliance.summary(checks)
    report: SystemDataReport = {
        "systemData": data,
        "listing": listing.listing_fields(data, data.get("networkSpeed"), data.get("location")),
        "compliance": {
            "isCompliant": ok,
            "failedComplianceReason": reason,
            "checks": [check.as_wire() for check in checks],
        },
    }
    report["fingerprint"] = fingerprint(report)
    return report


def as_sent(report: SystemDataReport) -> dict[str, Any]:
    """The body of PUT /agent/system-data: the report and when it went out.
    `gpuhost-agent probe --json` prints this too, so a host sees what is sent."""
    return {**report, "reportedAt": wire_time.iso()}


def fingerprint(report: SystemDataReport) -> str:
    """Changes when something a marketplace would show changes, not at every
    probe: the probe time and the clock's error estimate are left out, free
    disk counts only in whole GiB (so too in the other machines' reports of a
    Swarm environment), and compliance checks count by verdict, not by their
    wording (which quotes live figures such as free disk and skew)."""
    data = _steady(json.loads(json.dumps(report["systemData"])))
    for node in (data.get("environment") or {}).get("nodes") or []:
        machine = node.get("machine") or {}
        if isinstance(machine.get("systemData"), dict):
            _steady(machine["systemData"])
    verdicts = [(check["id"], check["ok"]) for check in report["compliance"]["checks"]]
    stable = {"systemData": data, "listing": report["listing"], "verdicts": verdicts}
    return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:16]


def _steady(data: dict) -> dict:
    """One machine's systemData without what changes at every probe (in place)."""
    data.pop("probedAt", None)
    host = data.get("host", {})
    host.get("clock", {}).pop("maxErrorMs", None)
    storage = host.get("storage", {})
    if storage.get("freeBytes") is not None:
        storage["freeBytes"] = storage["freeBytes"] // 1024**3
    return data

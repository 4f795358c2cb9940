"""The machine's facts as the agent sends them: systemData and its report.

`PUT /agent/system-data` carries what the probe found (inventory/system_data.py
builds it); the leader of a Swarm environment also receives each other
machine's (runtime/swarm_streams.py); core reads it for the GPUs it hands
out, the shares of the disk and memory, and the heartbeat. These TypedDicts
name the shape docs/agent-api.yaml gives (SystemData, NvmlInventory,
HostFacts, DockerFacts, SwarmEnvironment, SystemDataReport), down to the level core reads;
deeper parts (a GPU's figures, Docker's facts) stay mappings that the agent's
own readers check key by key. They are dicts at run time, exactly as built
or received; every key may be missing (total=False): another machine's
report is untrusted, and readers keep their `.get(...) or default`.
"""

from __future__ import annotations

from typing import Any, TypedDict


class NvmlInventory(TypedDict, total=False):
    """The driver and every GPU, as NVML reports them (inventory/nvml_probe.py)."""

    available: bool
    error: str | None
    driverVersion: str | None
    cudaDriverVersion: str | None
    gpus: list[dict[str, Any]]  # NvmlGpu or NvmlGpuUnreadable: uuid, error, eccUncorrectedErrors...
    unsupported: dict[str, str]


class DockerFacts(TypedDict, total=False):
    """The host's Docker Engine as the probe found it (docs/agent-api.yaml's
    DockerFacts): among the rest, what the sandbox and the shares read."""

    available: bool
    error: str | None
    version: str | None
    rootDir: str
    cgroupDriver: str
    cgroupVersion: str
    swarm: dict[str, Any]  # nodeId, role...
    gpuDelivery: dict[str, Any]  # method...
    storageQuota: dict[str, Any]  # available...
    cdiSpec: dict[str, Any]


class StorageFacts(TypedDict, total=False):
    """The disk the agent's data (and, on one machine, Docker's) is on."""

    path: str
    totalBytes: int | None
    freeBytes: int | None
    error: str | None


class HostFacts(TypedDict, total=False):
    """What the host probe found (inventory/host_probe.py): CPUs, memory, the
    storage the agent's data is on, the OS, Docker, Compose, the container
    toolkit, the clock, the egress fence and the pull guard."""

    cpu: dict[str, Any]
    memory: dict[str, Any]
    storage: StorageFacts
    os: dict[str, Any]
    docker: DockerFacts
    compose: dict[str, Any]
    nvidiaContainerToolkit: dict[str, Any]
    clock: dict[str, Any]
    egress: dict[str, Any]
    pullGuard: dict[str, Any]


class EnvironmentNode(TypedDict, total=False):
    """One machine of a Swarm environment, as its manager lists it, with its
    GPUs and (once asked) its own agent's report under `machine`."""

    nodeId: str
    hostname: str
    role: str
    state: str
    availability: str
    gpus: list[str]
    machine: dict[str, Any]


class EnvironmentFacts(TypedDict, total=False):
    """systemData's `environment` (docs/agent-api.yaml's SwarmEnvironment),
    sent only by the leader of an environment of several machines."""

    gpus: int
    error: str | None
    nodes: list[EnvironmentNode]


class SystemData(TypedDict, total=False):
    """One machine's systemData: everything the probe found out."""

    probedAt: str
    agentVersion: str
    hostname: str
    nvml: NvmlInventory
    host: HostFacts
    networkSpeed: dict[str, Any] | None
    location: str | None
    environment: EnvironmentFacts


class Compliance(TypedDict, total=False):
    """The verdict on the machine against the marketplace's minimums, with
    every check (inventory/compliance.py)."""

    isCompliant: bool
    failedComplianceReason: str | None
    checks: list[dict[str, Any]]  # id, ok, and the words that quote live figures


class SystemDataReport(TypedDict, total=False):
    """The body of `PUT /agent/system-data` (inventory/system_data.py's
    build_report; `reportedAt` is added as it is sent)."""

    systemData: SystemData
    listing: dict[str, Any]
    compliance: Compliance
    fingerprint: str
    reportedAt: str


class MachineAnswer(TypedDict, total=False):
    """Another machine's agent's answer to its leader (`GET /gpuhost/machine`,
    inventory/machine_report.py): that machine's systemData and its GPUs'
    live figures (`telemetry`), or `error`: why none
    (runtime/swarm_streams.py). Untrusted: its readers check each part."""

    systemData: SystemData
    telemetry: dict[str, Any]
    error: str


class MachineFigures(TypedDict, total=False):
    """One entry of a heartbeat's `machines`: another machine's GPUs' live
    figures, or `error`: why none."""

    gpus: list[dict[str, Any]]
    error: str

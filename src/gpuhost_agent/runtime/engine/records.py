"""The engine's JSON as the agent reads it: typed records of Docker's answers.

Each record names the keys the agent reads, spelled as the Engine API spells
them, so the code past this edge (core, streams) says which answer it works
on instead of a bare `dict`. They are TypedDicts, not classes: the objects
stay the very dicts the engine sent (nothing is copied or checked on the
way in), and every key may be missing, as it may be in what the engine
answers. The data is untrusted: readers keep their `.get(...) or default`.
"""

from __future__ import annotations

from typing import Any, TypedDict


class PortSummary(TypedDict, total=False):
    """One entry of a list entry's `Ports`."""

    IP: str
    PrivatePort: int
    PublicPort: int
    Type: str


class ContainerSummary(TypedDict, total=False):
    """One entry of `GET /containers/json` (and, on a Swarm, one task shaped
    as such by runtime/swarm_tasks.py, which adds `Error`)."""

    Id: str
    Names: list[str]
    Name: str  # not in Docker's list; read as a fallback where a record was built without `Names`
    Image: str
    ImageID: str
    Command: str
    Created: int
    Labels: dict[str, str]
    Ports: list[PortSummary]
    State: str
    Status: str
    Error: str  # a Swarm task's error
    HostConfig: dict[str, Any]
    NetworkSettings: dict[str, Any]
    Mounts: list[dict[str, Any]]


class EventActor(TypedDict, total=False):
    """The `Actor` of an engine event: the object's id and its attributes
    (a container's labels among them)."""

    ID: str
    Attributes: dict[str, str]


# One line of `GET /events`. Older engines also send `status`, `id` and `from`
# (a Python keyword: hence the functional form).
EngineEvent = TypedDict(
    "EngineEvent",
    {
        "Type": str,
        "Action": str,
        "Actor": EventActor,
        "scope": str,
        "time": int,
        "timeNano": int,
        "status": str,
        "id": str,
        "from": str,
    },
    total=False,
)


class ProgressDetail(TypedDict, total=False):
    current: int
    total: int


class PullEvent(TypedDict, total=False):
    """One line of an image pull's progress stream (`POST /images/create`)."""

    status: str
    id: str
    progress: str
    progressDetail: ProgressDetail
    error: str
    errorDetail: dict[str, Any]


class DiskUsage(TypedDict, total=False):
    """`GET /system/df`: each container's writable layer (`SizeRw`) and each
    volume's size (`UsageData.Size`), among the rest."""

    LayersSize: int
    Images: list[dict[str, Any]]
    Containers: list[dict[str, Any]]
    Volumes: list[dict[str, Any]]
    BuildCache: list[dict[str, Any]]


class DiskFigures(DiskUsage, total=False):
    """Another machine's disk figures as its agent answers the leader: the
    part of its `GET /system/df` that tells the rentals' use
    (runtime/swarm_stacks.py's rental_disk_figures), or `error`: why none."""

    error: str


class ContainerConfig(TypedDict, total=False):
    """The `Config` of an image's or a container's inspect: what a container
    starts from (a container's is its image's with the file's merged in)."""

    Image: str
    User: str
    Env: list[str]
    Cmd: list[str]
    Entrypoint: list[str]
    WorkingDir: str
    Labels: dict[str, str]
    ExposedPorts: dict[str, Any]
    Volumes: dict[str, Any]
    Healthcheck: dict[str, Any]


class NodeSummary(TypedDict, total=False):
    """One entry of a Swarm manager's `GET /nodes`: its id, its state
    (`Status.State`: ready, down...), its availability (`Spec.Availability`)
    and its host (`Description.Hostname`), among the rest."""

    ID: str
    Status: dict[str, Any]
    Spec: dict[str, Any]
    Description: dict[str, Any]
    ManagerStatus: dict[str, Any]


class ContainerState(TypedDict, total=False):
    """The `State` of a container's inspect: how its last run ended."""

    Status: str
    Running: bool
    Restarting: bool
    OOMKilled: bool
    Dead: bool
    ExitCode: int
    Error: str
    StartedAt: str
    FinishedAt: str

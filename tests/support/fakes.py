"""Stand-ins for the agent's own classes, one of each, typed against the real ones.

Each fake names the real class it stands in for (`stands_in_for`) and has the
real methods' signatures; whatever else it has for the test's side (what it
recorded, knobs) is listed in `test_side`. tests/unit/test_fakes.py checks
every fake's public methods against the real class with inspect.signature, so
a method renamed or re-shaped in the agent breaks that test, not a distant one
that happens to use the fake.

Keep them dumb: a fake records what it was given and answers what the test
set. Behaviour worth testing belongs to the real classes.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from collections.abc import Awaitable, Callable
from typing import ClassVar

from gpuhost_agent.core.containers.watch import ContainerWatch
from gpuhost_agent.core.host_reporter import HostReporter
from gpuhost_agent.core.init_state import InitState
from gpuhost_agent.core.schedule import Schedule
from gpuhost_agent.core.stacks.deploy_cancels import DeployCancels
from gpuhost_agent.core.stacks.deployer import StackDeployer
from gpuhost_agent.core.stacks.dispatcher import JobDispatcher
from gpuhost_agent.core.stacks.status_reporter import StackRef, StatusReporter
from gpuhost_agent.inventory.machines import Machines, OneMachine
from gpuhost_agent.inventory.nvml_probe import NvmlProbe
from gpuhost_agent.inventory.system_data import Prober
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.protocol import wire, wire_jobs
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.service.upgrades import Upgrades
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.streams.channel import StreamChannel
from gpuhost_agent.streams.sink import Sink
from gpuhost_agent.uplink.client import MarketplaceClient
from gpuhost_agent.uplink.outbox import Outbox, Report
from support.machine_samples import GPU_BEATS
from support.renter_streams import Demux

# ---- the marketplace side of reports: Outbox's `send` -------------------------------


class Recorder:
    """An outbox's `send` (uplink.outbox.Sender): a marketplace that acknowledges
    everything and remembers what came, in order."""

    def __init__(self) -> None:
        self.got: list[tuple[str, str, dict]] = []
        self.times: list[float] = []

    async def __call__(self, report: Report) -> None:
        self.times.append(time.monotonic())
        self.got.append((report.kind, report.target, report.body))


async def never_called(report: Report) -> None:  # pragma: no cover - reaching it fails the test
    """An outbox's `send` for tests in which nothing may be sent."""
    raise AssertionError(f"nothing should be sent: {report}")


class FakeOutbox:
    """Stands in for Outbox: keeps every report put, in order, and never sends."""

    stands_in_for: ClassVar[type] = Outbox
    test_side: ClassVar[tuple[str, ...]] = ()

    dropped = 0

    def __init__(self) -> None:
        self.reports: list[tuple[str, str, dict]] = []

    def put(self, kind: str, target: str, body: dict) -> None:
        self.reports.append((kind, target, body))

    def pending(self) -> int:
        return len(self.reports)


# ---- the agent's parts -----------------------------------------------------------------


class FakeSchedule:
    """Stands in for Schedule: periodic work is never run."""

    stands_in_for: ClassVar[type] = Schedule
    test_side: ClassVar[tuple[str, ...]] = ()

    def every(self, name: str, seconds: float, work: Callable[[], Awaitable[None]], *, now: bool = False) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class FakeDeployer:
    """Stands in for StackDeployer, the Docker side of a job: every job it is
    given ends at once, a deploy or a rental's end with success, a removal with
    `remove_error` ("" is success). It records the jobs it ran (`ran`) and sets
    `removed` on a removal."""

    stands_in_for: ClassVar[type] = StackDeployer
    test_side: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, remove_error: str = "") -> None:
        self.remove_error = remove_error
        self.ran: list[str] = []
        self.removed = asyncio.Event()

    async def deploy(self, job: wire_jobs.StackJob, stops: DeployCancels | None = None) -> str:
        self.ran.append(job.job_id)
        return ""

    async def remove(self, job: wire_jobs.StackJob) -> str:
        self.ran.append(job.job_id)
        self.removed.set()
        return self.remove_error

    async def end_rental(self, job: wire_jobs.StackJob) -> str:
        self.ran.append(job.job_id)
        return ""

    def rental_ending(self, rental_id: str) -> None:
        pass


class FakeReporter:
    """Stands in for StatusReporter: records the statuses (`reports`: stack id,
    status, errorMsg; also written to `db` when there is one, as the real one
    records them) and the container lists (`puts`) it was given."""

    stands_in_for: ClassVar[type] = StatusReporter
    test_side: ClassVar[tuple[str, ...]] = ()

    def __init__(self, db: AgentDB | None = None) -> None:
        self.db = db
        self.reports: list[tuple[str, str, str]] = []
        self.job_ids: list[str] = []
        self.puts: list[tuple[str, list[dict]]] = []

    def status(self, stack: StackRef, status: str, error_msg: str = "", *, job_id: str) -> None:
        self.reports.append((stack.stack_id, status, error_msg))
        self.job_ids.append(job_id)
        if self.db is not None:
            self.db.stack_status(stack.stack_id, stack.rental_id, stack.env_id, stack.project, status, error_msg)

    def refusal(self, stack_id: str, error_msg: str, *, job_id: str) -> None:
        self.reports.append((stack_id, wire.ERROR, error_msg))
        self.job_ids.append(job_id)

    def containers(self, stack_id: str, containers: list[dict]) -> None:
        self.puts.append((stack_id, containers))


class FakeHostReporter:
    """Stands in for HostReporter in opening a session: start-up phases go
    nowhere, nothing is probed or sent; the session replies it was given are
    kept (`opened`)."""

    stands_in_for: ClassVar[type] = HostReporter
    test_side: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.init = InitState(lambda _body: None)
        self.opened: list[dict] = []

    def session_opened(self, reply: dict, intervals: dict[str, float], sent_at: float, received_at: float) -> None:
        self.opened.append(reply)


class FakeContainerWatch:
    """Stands in for ContainerWatch in opening a session: which environment it
    was told to follow (`followed`)."""

    stands_in_for: ClassVar[type] = ContainerWatch
    test_side: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.followed: list[str] = []

    def follow(self, env_id: str) -> None:
        self.followed.append(env_id)


class FakeStreamChannel:
    """Stands in for StreamChannel in opening a session: what it adds to the
    session's info (the SSH host key), a fixed stand-in line here."""

    stands_in_for: ClassVar[type] = StreamChannel
    test_side: ClassVar[tuple[str, ...]] = ()

    def session_info(self) -> dict:
        return {"sshHostKey": "ssh-ed25519 AAAA-stand-in", "sshHostKeyFingerprint": "SHA256:stand-in"}


class FakeReleases:
    """Stands in for Upgrades in opening a session: what it adds to the
    session's info, and the replies whose offers it was given."""

    stands_in_for: ClassVar[type] = Upgrades
    test_side: ClassVar[tuple[str, ...]] = ("replies",)

    def __init__(self) -> None:
        self.replies: list[dict] = []

    def session_info(self) -> dict:
        return {"upgrade": {"running": "0.1.0", "lastAttempt": None}}

    def offered(self, reply: dict) -> None:
        self.replies.append(reply)


class FakeDispatcher:
    """Stands in for JobDispatcher as ContainerWatch asks it: the stacks with a job
    under way (`busy`) and the rentals being ended (`ending`)."""

    stands_in_for: ClassVar[type] = JobDispatcher
    test_side: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.busy: set[str] = set()
        self.ending: set[str] = set()

    def busy_stacks(self) -> set[str]:
        return self.busy

    def ending_rentals(self) -> set[str]:
        return self.ending


class FakeEngine:
    """Stands in for DockerEngine. `info` answers the given facts, or fails like
    an absent daemon when there are none; a stack's containers are `raw` (the
    calls counted in `lists`), every container's state is an OOM kill with exit
    code 137 (the calls counted in `inspects`); the GPU check fails as on a
    machine without a GPU. `GET /system/df` answers `df`; a rental's
    containers are those of `raw` with its label; stops are kept in `stopped`."""

    stands_in_for: ClassVar[type] = DockerEngine
    test_side: ClassVar[tuple[str, ...]] = ()

    def __init__(self, raw: list[dict] | None = None, *, info: dict | None = None, df: dict | None = None) -> None:
        self.raw = raw if raw is not None else []
        self._info = info
        self.df = df or {}  # what `GET /system/df` answers
        self.lists, self.inspects = 0, 0
        self.stopped: list[str] = []

    async def info(self) -> dict:
        if self._info is None:
            raise EngineError("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
        return self._info

    async def gpu_container_check(self, image: str) -> str | None:
        return "container exited with code 1: no CUDA-capable device is detected"

    async def managed_networks(self) -> list[dict]:
        """The agent's networks: none (as the engine answers, or fails like `info`)."""
        if self._info is None:
            raise EngineError("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
        return []

    async def stack_containers(self, stack_id: str) -> list[dict]:
        self.lists += 1
        await asyncio.sleep(0.005)
        return [dict(r) for r in self.raw]

    async def container_state(self, container_id: str) -> dict:
        self.inspects += 1
        return {"ExitCode": 137, "OOMKilled": True}

    async def disk_usage(self) -> dict:
        return self.df

    async def rental_containers(self, rental_id: str) -> list[dict]:
        return [dict(r) for r in self.raw if (r.get("Labels") or {}).get(wire.LABEL_RENTAL) == rental_id]

    async def stop_container(self, container_id: str, timeout: int) -> None:
        self.stopped.append(container_id)


class FakeClient:
    """Stands in for MarketplaceClient. open_session keeps what the agent sent
    (`info`) and opens session "s"; heartbeat hands the beat to a local
    marketplace's state as its HTTP handler does (`beats`, `replies`)."""

    stands_in_for: ClassVar[type] = MarketplaceClient
    test_side: ClassVar[tuple[str, ...]] = ()

    def __init__(self, state: MarketplaceState | None = None) -> None:
        self.state = state
        self.info: dict | None = None
        self.beats: list[dict] = []
        self.replies: list[dict] = []

    async def open_session(self, info: dict) -> dict:
        self.info = info
        return {"sessionId": "s", "envId": "env-1", "requeuedJobs": 0, "intervals": {}}

    async def heartbeat(self, body: dict) -> dict:
        assert self.state is not None, "FakeClient(state) answers heartbeats"
        body = json.loads(json.dumps(body))
        self.beats.append(body)
        self.replies.append(self.state.accept_heartbeat(body))
        return self.replies[-1]


class FakeNvml:
    """Stands in for NvmlProbe: fixed GPU figures."""

    stands_in_for: ClassVar[type] = NvmlProbe
    test_side: ClassVar[tuple[str, ...]] = ()

    def __init__(self, beats: list[dict]) -> None:
        self.beats = beats

    def telemetry(self) -> list[dict]:
        return copy.deepcopy(self.beats)


class FakeProber:
    """Stands in for inventory.system_data.Prober: a fixed probe, fixed GPU figures."""

    stands_in_for: ClassVar[type] = Prober
    test_side: ClassVar[tuple[str, ...]] = ()

    def __init__(self, data: dict, beats: list[dict] = GPU_BEATS) -> None:
        self.data = data
        self.nvml = FakeNvml(beats)
        self.speed: dict | None = None
        self.compose_command: list[str] | None = ["docker", "compose"]
        self.machines: Machines = OneMachine()  # the environment's machines (a test may set a leader's)

    async def system_data(self) -> dict:
        return copy.deepcopy(self.data)


# ---- time --------------------------------------------------------------------------------


class FastAsyncio:
    """Stands in for the asyncio module as one agent module sees it
    (monkeypatch.setattr(agent_module, "asyncio", FastAsyncio())): its back-off
    sleeps are recorded in `delays` and cut short; everything else is asyncio's."""

    stands_in_for: ClassVar[object] = asyncio
    test_side: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __getattr__(self, name: str):
        return getattr(asyncio, name)

    async def sleep(self, delay: float, result=None):
        self.delays.append(delay)
        await asyncio.sleep(min(delay, 0.01))
        return result


# ---- streams -----------------------------------------------------------------------------


class MemorySink:
    """Stands in for a stream's WebSocket (streams.sink.Sink), in memory.

    Its speed is the test's to control: `gate` cleared stalls it (as a reader
    that stopped reading), `delay` slows every message. What it received is read
    back with support.renter_streams.Demux, not with the agent's parser."""

    stands_in_for: ClassVar[type] = Sink
    test_side: ClassVar[tuple[str, ...]] = ("peer_closes", "type", "lines", "until", "output")

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.gate = asyncio.Event()
        self.gate.set()
        self.demux = Demux()
        self.binary = bytearray()
        self.messages = 0
        self.texts: list[dict] = []
        self.closed = asyncio.Event()
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.changed = asyncio.Event()

    async def send_bytes(self, data: bytes) -> None:
        await self.gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        assert not self.closed.is_set(), "sent after close"
        self.messages += 1
        self.binary += data
        self.demux.feed(data)
        self.changed.set()

    async def send_json(self, message: dict) -> None:
        assert not self.closed.is_set(), "sent after close"
        self.texts.append(json.loads(json.dumps(message)))
        self.changed.set()

    async def receive(self) -> bytes | str | None:
        return await self.inbox.get()

    async def close(self) -> None:
        self.closed.set()
        self.inbox.put_nowait(None)
        self.changed.set()

    # ---- the test's side ---------------------------------------------------------
    def peer_closes(self) -> None:
        self.inbox.put_nowait(None)

    def type(self, data: bytes | str) -> None:
        self.inbox.put_nowait(data)

    def lines(self, stream: int) -> list[str]:
        return self.demux.lines(stream)

    async def until(self, predicate, timeout: float = 10) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            remaining = deadline - loop.time()
            assert remaining > 0, f"sink: condition not reached; texts {self.texts}, tail {bytes(self.binary[-300:])!r}"
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)

    def output(self) -> str:
        return self.binary.decode(errors="replace")


# Every fake above, for tests/unit/test_fakes.py.
FAKES: tuple[type, ...] = (
    FakeOutbox,
    FakeSchedule,
    FakeDeployer,
    FakeReporter,
    FakeHostReporter,
    FakeContainerWatch,
    FakeStreamChannel,
    FakeDispatcher,
    FakeEngine,
    FakeClient,
    FakeNvml,
    FakeProber,
    MemorySink,
    FastAsyncio,
)

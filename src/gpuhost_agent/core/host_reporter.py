"""The machine's side of the Environment: start-up phases, systemData with the
listing fields and compliance, heartbeats, and the network speed test.

Start-up waits for what stacks need (Docker, Compose) and tells the marketplace
what it is waiting for; heartbeats begin as soon as a session is open, so a
host stuck on a missing Docker is still seen as alive and told why it is not
ready. systemData goes out when its fingerprint changes (or when the
marketplace asks for it again), never at every beat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from gpuhost_agent import __version__
from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.gpus.allocation import slots_from_facts
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.init_state import InitState
from gpuhost_agent.core.schedule import Schedule
from gpuhost_agent.inventory import netspeed, telemetry
from gpuhost_agent.inventory.system_data import Prober, as_sent, build_report
from gpuhost_agent.protocol import intervals as wire_intervals
from gpuhost_agent.protocol import wire_time
from gpuhost_agent.protocol.requirements import Requirements
from gpuhost_agent.protocol.wire_replies import HeartbeatReply, SessionReply
from gpuhost_agent.protocol.wire_system import Compliance, SystemData, SystemDataReport
from gpuhost_agent.runtime.compose import ComposeNotFound
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.uplink.client import MarketplaceClient, retry_delay
from gpuhost_agent.uplink.outbox import INIT_STATE, SYSTEM_DATA, Outbox
from gpuhost_agent.uplink.replies import MarketplaceRejected, MarketplaceUnavailable

log = get_logger(__name__)
MIN_HEARTBEAT = 0.1
BEAT_MACHINE_SECONDS = 3.0  # a silent machine's agent delays a heartbeat no longer than this


@dataclass(frozen=True, kw_only=True)
class HostReporterParts:
    """What it reports through and with: the client (heartbeats, the speed
    test), the outbox (systemData, initState), the prober (the machine), the
    schedule (beats, probes, speed tests), `find_compose`, which looks for the Compose command, and
    `compose_found`, which hears the one start-up settled on (the deployer's
    Compose runner uses it from then on). Every heartbeat says which GPUs the
    `ledger` has free, assigned and being released, and a change sends a beat
    at once (the marketplace's availableGPUs); none: no GPUs said."""

    client: MarketplaceClient
    outbox: Outbox
    prober: Prober
    schedule: Schedule
    find_compose: Callable[[], list[str]]
    compose_found: Callable[[list[str]], None]
    ledger: GpuLedger | None = None


@dataclass(frozen=True, kw_only=True)
class HostReportSettings:
    """The speed test's bounds (GPUHOST_SPEED_MAX_BYTES, _SECONDS), and the
    outbox target the reports go to."""

    speed_max_bytes: int
    speed_max_seconds: float
    env_target: str = "env"


class ComplianceView(Compliance, total=False):
    """The last probe's compliance and when that probe ran (the status socket's)."""

    probedAt: str | None


class HeartbeatStats(TypedDict):
    lastAt: str | None
    failures: int
    intervalSeconds: float | None
    clockSkewSeconds: float | None


class HostStats(TypedDict):
    """What the status socket shows of the reporter."""

    initState: dict[str, object]
    heartbeat: HeartbeatStats


class HostReporter:
    def __init__(self, *, parts: HostReporterParts, settings: HostReportSettings):
        """Its collaborators, and the settings it reports by: two parts, by keyword."""
        ledger = parts.ledger
        self.ledger = ledger
        self._beat_soon: asyncio.Task | None = None
        # Said in every beat, and hear every reply: the upgrades (AgentInfo.upgrade, and a
        # reply's agentRelease), added by the composition root.
        self.beat_facts: list[Callable[[], dict[str, object]]] = []
        self.heartbeat_replies: list[Callable[[HeartbeatReply], None]] = []
        if ledger is not None:
            ledger.on_change.append(self.beat_soon)
        self.client = parts.client
        self.outbox = parts.outbox
        self.prober = parts.prober
        self.schedule = parts.schedule
        self.find_compose = parts.find_compose
        self.target = settings.env_target
        self.speed_limits = (settings.speed_max_bytes, settings.speed_max_seconds)
        self.requirements = Requirements()
        self.intervals = wire_intervals.from_reply(None)
        self.clock_skew: float | None = None
        self.last_report: SystemDataReport | None = None
        self.sent_fingerprint: str | None = None
        self.init = InitState(lambda body: self.outbox.put(INIT_STATE, self.target, body))
        self.compose_found = parts.compose_found
        self._started = time.monotonic()
        self._beat_failures = 0
        self._speed_task: asyncio.Task | None = None
        self._last_resend = float("-inf")
        self.last_beat_at: str | None = None

    @property
    def beat_failures(self) -> int:
        return self._beat_failures

    def stats(self) -> HostStats:
        return {
            "initState": self.init.as_wire(),
            "heartbeat": {
                "lastAt": self.last_beat_at,
                "failures": self._beat_failures,
                "intervalSeconds": self.intervals.get("heartbeatSeconds"),
                "clockSkewSeconds": self.clock_skew,
            },
        }

    def compliance(self) -> ComplianceView | None:
        """The last probe's verdict with every check (as systemData carries it)
        and when that probe ran, for the status socket; None before the first."""
        if self.last_report is None:
            return None
        view: ComplianceView = {
            **self.last_report["compliance"],
            "probedAt": self.last_report["systemData"].get("probedAt"),
        }
        return view

    # ---- session --------------------------------------------------------------
    def session_opened(
        self, reply: SessionReply, intervals: dict[str, float], sent_at: float, received_at: float
    ) -> None:
        """Take the marketplace's minimums, intervals (read from the reply once,
        by the session) and clock from its reply."""
        self.requirements = Requirements.from_wire(reply.get("requirements"))
        self.intervals = dict(intervals)
        self._note_server_time(reply.get("serverTime"), sent_at, received_at)
        # The first beat at once: the marketplace sees the machine alive from its first session.
        self.schedule.every("heartbeat", max(MIN_HEARTBEAT, self.intervals["heartbeatSeconds"]), self.beat, now=True)

    def _note_server_time(self, server_time: object, sent_at: float, received_at: float) -> None:
        if not wire_time.is_moment(server_time):
            return
        assert isinstance(server_time, str)
        server = wire_time.parse_iso(server_time).timestamp()
        self.clock_skew = round((sent_at + received_at) / 2 - server, 3)

    # ---- start-up ------------------------------------------------------------
    async def bring_up(self) -> None:
        """Docker, Compose, hardware, compliance; returns when stacks can run."""
        await self._until_done("docker", self._docker_ready)
        await self._until_done("compose", self._compose_ready)
        self.init.begin("hardware")
        report = await self.refresh(force=True)
        gpus = report["listing"]["totalGPUs"]
        self.init.done("hardware", f"{gpus} GPU(s), {report['listing']['totalCPUs']} CPUs")
        self.init.begin("compliance")
        verdict = report["compliance"]
        self.init.done(
            "compliance",
            "compliant" if verdict["isCompliant"] else f"not compliant: {verdict['failedComplianceReason']}",
        )
        self.init.ready()
        self.schedule.every("system_data", self.intervals["systemDataSeconds"], self.refresh)
        self.schedule.every("network_speed", self.intervals["networkSpeedSeconds"], self.measure_network)
        self._speed_task = asyncio.create_task(self.measure_network(), name="network-speed")

    async def _until_done(self, phase: str, attempt: Callable) -> None:
        failures = 0
        self.init.begin(phase)
        while True:
            try:
                detail = await attempt()
            except (EngineError, ComposeNotFound) as exc:
                failures += 1
                delay = retry_delay(failures, base=1.0, ceiling=30.0)
                self.init.failed(phase, str(exc))
                log.warning("startup_waiting", phase=phase, error=str(exc), retry_in_s=round(delay, 1))
                await asyncio.sleep(delay)
                continue
            self.init.done(phase, detail)
            return

    async def _docker_ready(self) -> str:
        info = await self.prober.engine.info()
        return f"Docker Engine {info.get('ServerVersion')}"

    async def _compose_ready(self) -> str:
        command = self.prober.compose_command
        if command is None:
            command = await asyncio.to_thread(self.find_compose)
        self.prober.compose_command = command
        self.compose_found(command)
        return " ".join(command)

    async def machine_facts(self) -> SystemData:
        """The latest probe's systemData (GPUs and their health, CPUs, memory),
        for the sandbox's GPU assignment and shares."""
        report = self.last_report if self.last_report is not None else await self.refresh()
        return report["systemData"]

    # ---- periodic work -------------------------------------------------------
    async def refresh(self, force: bool = False) -> SystemDataReport:
        """Probe again; send systemData if anything a marketplace shows changed."""
        data = await self.prober.system_data()
        report = build_report(data, self.requirements, self.clock_skew)
        self.last_report = report
        if force or report["fingerprint"] != self.sent_fingerprint:
            self._send(report)
        return report

    async def environment_changed(self) -> None:
        """A machine of the environment went or came back (core/swarm/watch.py):
        the listing and the GPUs' states now, not at the next probe."""
        await self.refresh()
        self.beat_soon()

    def _send(self, report: SystemDataReport) -> None:
        self.sent_fingerprint = report["fingerprint"]
        self.outbox.put(SYSTEM_DATA, self.target, as_sent(report))
        log.info(
            "system_data_queued",
            fingerprint=report["fingerprint"],
            gpus=report["listing"]["totalGPUs"],
            compliant=report["compliance"]["isCompliant"],
        )

    async def measure_network(self) -> None:
        max_bytes, max_seconds = self.speed_limits
        result = await netspeed.measure_speed(
            self.client.http(), self.client.base_url, max_bytes=max_bytes, max_seconds=max_seconds
        )
        published = self.prober.speed = netspeed.as_wire(result)
        if published["error"]:  # not published, or not measured: the log says so, as the report does
            log.info(
                "network_speed_not_published",
                error=published["error"],
                measured_upload_mbps=result.upload_mbps,
                measured_download_mbps=result.download_mbps,
            )
        else:
            log.info("network_speed_measured", upload_mbps=result.upload_mbps, download_mbps=result.download_mbps)
        if self.init.state == "ready":
            await self.refresh()

    def beat_soon(self) -> None:
        """A beat now, out of turn (GPUs were assigned or freed), once the
        beats have begun; changes in a burst share one."""
        if self.last_beat_at is None or (self._beat_soon is not None and not self._beat_soon.done()):
            return
        try:
            self._beat_soon = asyncio.get_running_loop().create_task(self.beat(), name="heartbeat-now")
        except RuntimeError:
            pass  # no loop (a tool that reads the ledger): the next beat says it

    async def beat(self) -> None:
        storage = ((self.last_report or {}).get("systemData") or {}).get("host", {}).get("storage", {}).get("path")
        figures = await asyncio.to_thread(telemetry.snapshot, self.prober.nvml, storage)
        body = {
            "sentAt": wire_time.iso(),
            "agentVersion": __version__,
            "uptimeSeconds": round(time.monotonic() - self._started, 1),
            "initState": self.init.as_wire()["state"],
            "fingerprint": self.sent_fingerprint,
            **figures,
            "reports": {"pending": self.outbox.pending(), "dropped": self.outbox.dropped},
        }
        for facts in self.beat_facts:
            body.update(facts())
        system_data = (self.last_report or {}).get("systemData") or {}
        machines = await self.prober.machines.beat_figures(system_data, BEAT_MACHINE_SECONDS)
        if machines is not None:  # an environment of several machines: the other machines' GPUs too
            body["machines"] = machines
        if self.ledger is not None and self.last_report is not None:  # once the machine's GPUs are known
            body["gpuAssignments"] = self.ledger.states(slots_from_facts(self.last_report.get("systemData") or {}))
        sent_at = time.time()
        try:
            reply = await self.client.heartbeat(body)
            self.last_beat_at = body["sentAt"]
        except (MarketplaceUnavailable, MarketplaceRejected) as exc:
            self._beat_failures += 1
            if self._beat_failures == 1:
                log.warning("heartbeat_failed", error=str(exc))
            return
        if self._beat_failures:
            log.info("heartbeat_restored", after_failures=self._beat_failures)
            self._beat_failures = 0
            self.outbox.retry_now()  # the reports held back meanwhile need not wait out their back-off
        self._note_server_time(reply.get("serverTime"), sent_at, time.time())
        interval = wire_intervals.seconds("heartbeatSeconds", reply.get("heartbeatIntervalSeconds"))
        if interval is not None and interval != self.intervals["heartbeatSeconds"]:
            self.intervals["heartbeatSeconds"] = interval
            self.schedule.every("heartbeat", max(MIN_HEARTBEAT, interval), self.beat)
            log.info("heartbeat_interval_changed", interval_s=interval)
        for listener in self.heartbeat_replies:
            listener(reply)
        if reply.get("systemDataWanted") and self.last_report is not None:
            # At most once per systemData interval: a marketplace that refuses
            # the report would otherwise ask for it again at every beat.
            now = time.monotonic()
            if now - self._last_resend >= self.intervals["systemDataSeconds"]:
                self._last_resend = now
                log.info("system_data_requested_again")
                self._send(self.last_report)

    async def stop(self) -> None:
        if self._speed_task is not None:
            self._speed_task.cancel()
            await asyncio.gather(self._speed_task, return_exceptions=True)

"""The store plus what the HTTP handlers share: saving, waking long polls, and
the machine's liveness (heartbeats are kept in memory: they are news, not
records)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpuhost_agent.local_marketplace.channel_hub import ChannelHub
from gpuhost_agent.local_marketplace.install_release import InstallRelease
from gpuhost_agent.local_marketplace.releases import Release
from gpuhost_agent.local_marketplace.store import Job, Store
from gpuhost_agent.local_marketplace.terminal_tickets import TicketBook
from gpuhost_agent.local_marketplace.tunnels.book import TunnelBook
from gpuhost_agent.protocol import release_signature, wire_time
from gpuhost_agent.protocol.intervals import DEFAULT_INTERVALS
from gpuhost_agent.protocol.requirements import Requirements

OFFLINE_AFTER_MISSED_BEATS = 3

STACKS_PER_RENTAL = 16


class MarketplaceState:
    def __init__(self, store: Store, intervals: dict | None = None, requirements: dict | None = None):
        self.store = store
        self.intervals = {**DEFAULT_INTERVALS, **(intervals or {})}
        self.requirements = {**asdict(Requirements()), **(requirements or {})}
        # Stacks one rental may have (each makes networks from the host's address pools, shared by all rentals).
        self.stacks_per_rental = STACKS_PER_RENTAL
        self.session_id: str | None = None
        self.sessions_opened = 0  # for tests and operators: how often an agent opened a session
        self.polls_started = 0
        self.heartbeat: dict | None = None  # last beat, with when and at what interval
        self.beats_received = 0
        self.system_data_received = 0
        self._jobs_posted = asyncio.Event()
        self.closing = False  # the server is stopping: long polls answer now, with nothing
        self.streams = ChannelHub()  # the agent's channel and the live log and terminal streams
        self.terminals = TicketBook()
        self.tunnels = TunnelBook(store, self.streams)  # the stacks' tunnels (tunnels.py)
        self.release: Release | None = None  # the agent release offered in session replies (releases.py)
        self.install_release: InstallRelease | None = None  # what the installation line installs

    def changed(self, *, jobs: bool = False) -> None:
        """Persist, and if new jobs were queued wake every waiting long poll."""
        self.store.save()
        if jobs:
            self._jobs_posted.set()
            self._jobs_posted = asyncio.Event()

    def close_polls(self) -> None:
        """Every waiting long poll answers now, empty: a poll whose agent went
        away is not noticed by aiohttp, and would hold the server's shutdown
        for its whole timeout."""
        self.closing = True
        self._jobs_posted.set()

    def expire_rentals(self) -> list[str]:
        """Rentals past their endDate end now; their removal jobs wake the agent's poll."""
        ended = self.store.expire_rentals()
        if ended:
            self.changed(jobs=True)
        for rental_id in ended:
            self.streams.end_rental(rental_id)
        return ended

    def end_rental(self, rental_id: str) -> dict:
        """End a rental now (the renter's DELETE): its stacks' removal jobs wake
        the agent's poll, and its log streams and terminals end."""
        rental = self.store.end_rental(rental_id)
        self.changed(jobs=True)
        self.streams.end_rental(rental_id)
        return rental

    async def expire_rentals_forever(self, period: float = 1.0) -> None:
        while True:
            self.expire_rentals()
            await asyncio.sleep(period)

    def new_session(self) -> tuple[str, int]:
        self.session_id = str(uuid.uuid4())
        self.sessions_opened += 1
        self.streams.session_changed(self.session_id)
        requeued = self.store.requeue_unfinished()
        self.changed(jobs=True)  # a poll of the superseded session answers at once (409), not at its wait's end
        return self.session_id, requeued

    async def wait_for_jobs(
        self,
        wait_seconds: float,
        max_jobs: int,
        session_id: str | None = None,
        still_there: Callable[[], bool] = lambda: True,
    ) -> list[Job]:
        """Jobs as soon as there are any, else an empty list after wait_seconds.

        A poll whose agent is gone (its connection closed: aiohttp does not
        cancel the handler) or whose session was superseded by a newer one
        takes nothing: the jobs it would take would be lost until their lease
        ran out."""
        self.polls_started += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        while True:
            event = self._jobs_posted
            if self.closing or not still_there() or (session_id and self.session_id and session_id != self.session_id):
                return []
            jobs = self.store.deliverable(max_jobs)
            if jobs:
                self.store.save()
                return jobs
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                return []

    def redeliver(self, job_id: str) -> None:
        """Hand a job out again as a lossy network would (used by tests and by
        operators who want an agent to redo a job)."""
        job = self.store.jobs[job_id]
        job.state = "queued"
        self.changed(jobs=True)

    # ---- the machine -----------------------------------------------------------
    def accept_system_data(self, body: dict) -> bool:
        previous = self.store.host.get("report") or {}
        if previous.get("reportedAt") and wire_time.parse_iso(previous["reportedAt"]) > wire_time.parse_iso(
            body["reportedAt"]
        ):
            return False  # an older report arriving late
        self.store.host["report"] = body
        self.system_data_received += 1
        self.changed()
        return True

    def accept_init_state(self, body: dict) -> bool:
        previous = self.store.host.get("initState") or {}
        if previous.get("updatedAt") and wire_time.parse_iso(previous["updatedAt"]) > wire_time.parse_iso(
            body["updatedAt"]
        ):
            return False
        self.store.host["initState"] = body
        self.changed()
        return True

    def accept_heartbeat(self, body: dict) -> dict:
        """Record the beat; answer with the interval to use from now on, and ask
        for systemData again when ours is missing or not the one the agent has."""
        interval = self.intervals["heartbeatSeconds"]
        self.heartbeat = {"body": body, "receivedAt": time.time(), "intervalSeconds": interval}
        if isinstance(body.get("gpuAssignments"), dict):
            self.store.live["gpuAssignments"] = body["gpuAssignments"]
        self.beats_received += 1
        if isinstance(body.get("upgrade"), dict):  # checked by host_api.heartbeat_problem
            self.store.host["agentUpgrade"] = body["upgrade"]
        report = self.store.host.get("report") or {}
        wanted = body.get("fingerprint") is not None and report.get("fingerprint") != body.get("fingerprint")
        reply = {"heartbeatIntervalSeconds": interval, "systemDataWanted": wanted, "serverTime": wire_time.iso()}
        if self.release is not None:
            reply["agentRelease"] = self.release.offer(self.release_key())
        return reply

    def release_key(self) -> Ed25519PrivateKey:
        """The key this marketplace signs its releases with (kept in its store)."""
        return release_signature.parse_private(self.store.releaseKey)

    def release_public_key(self) -> str:
        """Its public half, as install.sh --release-key pins it: `ed25519:<base64>`."""
        return release_signature.public_text(self.release_key().public_key())

    def liveness(self, now: float | None = None) -> dict:
        """Environment.heartbeat: online until OFFLINE_AFTER_MISSED_BEATS beats are missed."""
        if self.heartbeat is None:
            return {
                "online": False,
                "lastBeatAt": None,
                "intervalSeconds": self.intervals["heartbeatSeconds"],
                "missedBeats": None,
                "agentVersion": None,
                "upgrade": self.store.host.get("agentUpgrade"),
                "uptimeSeconds": None,
                "initState": None,
                "host": None,
                "gpus": None,
            }
        now = time.time() if now is None else now
        interval = self.heartbeat["intervalSeconds"]
        missed = int((now - self.heartbeat["receivedAt"]) // interval)
        body = self.heartbeat["body"]
        return {
            "online": missed < OFFLINE_AFTER_MISSED_BEATS,
            "lastBeatAt": wire_time.iso_from_timestamp(self.heartbeat["receivedAt"]),
            "intervalSeconds": interval,
            "missedBeats": missed,
            "agentVersion": body.get("agentVersion"),
            "upgrade": self.store.host.get("agentUpgrade"),
            "uptimeSeconds": body.get("uptimeSeconds"),
            "initState": body.get("initState"),
            "host": body.get("host"),
            "gpus": body.get("gpus"),
        }

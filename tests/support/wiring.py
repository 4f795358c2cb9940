"""Builders for tests that run one part of the agent with stand-ins around it.

The composition root (service/wiring.py) takes every collaborator through
constructors; these builders do the same with in-memory or fake ones
(support/fakes.py), so a test names only the collaborator it is about.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gpuhost_agent.core.agent import Agent, AgentDuties, AgentWatchers, MarketplaceSide
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.rentals.end_dates import RentalEndDates
from gpuhost_agent.core.stacks.dispatcher import JobDispatcher
from gpuhost_agent.core.stacks.status_reporter import StatusReporter
from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.service import metrics
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.streams.channel import StreamChannel
from gpuhost_agent.streams.ssh import host_key as ssh_host_key
from gpuhost_agent.streams.ssh.access import RentalKeys, SshServices
from gpuhost_agent.uplink.session import SessionState
from support.fakes import FakeContainerWatch, FakeHostReporter, FakeReleases, FakeSchedule, FakeStreamChannel
from support.settings import defaults


async def _no_streams(_rental_id: str) -> None:
    """No stream channel: nothing to end when a rental ends."""


def dispatcher_for(deployer: Any, outbox: Any, db: AgentDB | None = None, **options: Any) -> JobDispatcher:
    """A real dispatcher (and status reporter) around a stand-in deployer and
    outbox; `options` are JobDispatcher's own (deploy_concurrency)."""
    db = db if db is not None else AgentDB(None)
    reporter = StatusReporter(outbox, db, GpuLedger(db))
    return JobDispatcher(
        deployer,
        reporter,
        outbox,
        db,
        RentalEndDates(db),
        _no_streams,
        metrics.deploy_histogram(),
        **{**defaults("deploy_concurrency"), **options},
    )


class NotScheduled:
    """A periodic part (disk watch, GPU events, usage meter) of an agent whose
    `run` is never called: a test of the session and the poll loop alone."""

    interval = 60.0

    async def run_once(self) -> None:
        raise AssertionError("the agent's schedule does not run in this test")

    tick = run_once

    def start(self) -> None:
        raise AssertionError("the agent's GPU events do not run in this test")

    async def stop(self) -> None:
        """Nothing was started."""


def agent_for(client: Any, *, outbox: Any = None, dispatcher: JobDispatcher | None = None) -> Agent:
    """A real Agent for its session and poll loop alone (`_open_session`,
    `_poll_forever`): the parts those never reach are None, or NotScheduled."""
    idle: Any = NotScheduled()
    marketplace = MarketplaceSide(
        client=client, session=SessionState(), outbox=outbox, streams=FakeStreamChannel(), releases=FakeReleases()
    )
    duties = AgentDuties(
        db=AgentDB(None),
        dispatcher=dispatcher,
        schedule=FakeSchedule(),
        host=FakeHostReporter(),
        reconciler=None,
        rental_clock=None,
    )
    watchers = AgentWatchers(
        engine_watch=None,
        container_watch=FakeContainerWatch(),
        disk_watch=idle,
        gpu_events=idle,
        usage=idle,
    )
    return Agent(marketplace=marketplace, duties=duties, watchers=watchers)


async def stream_channel(client: Any, env_id: str, state_dir: Path, **options: Any) -> StreamChannel:
    """A real StreamChannel on the real engine, its SSH host key in `state_dir`
    (made in a thread: the tests run on the event loop, the agent's start-up not)."""
    engine = EngineStreams()
    host_key = await asyncio.to_thread(ssh_host_key.load_or_create, state_dir)
    ssh = SshServices(engine, RentalKeys(client.rental_ssh_keys), host_key, engine.stack_containers)
    return StreamChannel(client, SessionState(env_id), engine, ssh, **options)

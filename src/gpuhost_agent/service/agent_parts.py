"""The parts of a running agent that the daemon starts and stops and the
status socket asks for figures: one record, built by the composition root
(service/wiring.py) and read by the status server (service/status/server.py),
so that neither imports the other to name it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gpuhost_agent.core import upgrade_plan
from gpuhost_agent.core.agent import Agent
from gpuhost_agent.core.disk_watch import DiskWatch
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.host_reporter import HostReporter
from gpuhost_agent.core.init_state import READY
from gpuhost_agent.core.reconcile.reconciler import Reconciler
from gpuhost_agent.core.stacks.deployer import StackDeployer
from gpuhost_agent.core.stacks.dispatcher import JobDispatcher
from gpuhost_agent.core.stacks.status_reporter import StatusReporter
from gpuhost_agent.inventory.nvml_probe import NvmlProbe
from gpuhost_agent.runtime.engine.client import DockerEngine
from gpuhost_agent.runtime.engine.watch import EngineWatch
from gpuhost_agent.service.upgrades import Upgrades
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.streams.channel import StreamChannel
from gpuhost_agent.uplink.client import MarketplaceClient
from gpuhost_agent.uplink.outbox import Outbox
from gpuhost_agent.uplink.session import SessionState


@dataclass
class AgentParts:
    """What the daemon starts and stops, and what the status socket asks for figures."""

    agent: Agent
    session: SessionState
    client: MarketplaceClient
    outbox: Outbox
    dispatcher: JobDispatcher
    deployer: StackDeployer
    engine: DockerEngine
    nvml: NvmlProbe
    host: HostReporter
    db: AgentDB
    reconciler: Reconciler
    engine_watch: EngineWatch
    streams: StreamChannel
    reporter: StatusReporter  # the status socket shows the container lists it last sent
    upgrades: Upgrades
    restart: asyncio.Event  # set when an installed upgrade wants systemd to start the agent again
    ledger: GpuLedger | None = None  # the GPUs out of service (metrics)
    disk_watch: DiskWatch | None = None  # the rentals over their disk share (metrics)

    def trial_health(self) -> str | None:
        """What a version on trial still lacks (core/upgrade_plan.py)."""
        return upgrade_plan.health_problem(
            self.session.connected.is_set(),
            self.host.init.state == READY,
            self.reconciler.runs > 0,
            unreachable=self.session.unreachable,
        )

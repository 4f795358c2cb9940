"""The composition root: the one place that builds the agent's objects and
hands each its collaborators. Everything else receives what it needs.

With no marketplace configured, the local marketplace is built here too, and
the agent talks to it over real HTTP on loopback, exactly as it would to the
real one.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Callable
from dataclasses import dataclass

from gpuhost_agent.service import sd_notify, status_server
from gpuhost_agent.core.agent import Agent, send_report
from gpuhost_agent.uplink.client import MarketplaceClient
from gpuhost_agent.service.config import AgentConfig
from gpuhost_agent.core.deployer import StackDeployer
from gpuhost_agent.core.dispatcher import JobDispatcher
from gpuhost_agent.core.gpu_ledger import GpuLedger
from gpuhost_agent.core.reconciler import Reconciler
from gpuhost_agent.core.rental_clock import RentalClock
from gpuhost_agent.core.sandbox import Sandbox
from gpuhost_agent.core.host_reporter import HostReporter
from gpuhost_agent.inventory.nvml_probe import NvmlProbe
from gpuhost_agent.inventory.system_data import Prober
from gpuhost_agent.common.logs import SECRETS, get_logger
from gpuhost_agent.local_marketplace import server as local_server
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.uplink.outbox import Outbox
from gpuhost_agent.runtime.compose import ComposeRunner, find_compose_command
from gpuhost_agent.runtime.engine import DockerEngine
from gpuhost_agent.runtime.engine_watch import EngineWatch
from gpuhost_agent.storage.agent_db import DB_FILE, AgentDB
from gpuhost_agent.streams.channel import StreamChannel
from gpuhost_agent.core.schedule import Schedule

log = get_logger(__name__)


@dataclass
class AgentParts:
    agent: Agent
    client: MarketplaceClient
    outbox: Outbox
    dispatcher: JobDispatcher
    engine: DockerEngine
    host: HostReporter
    db: AgentDB
    reconciler: Reconciler


def build_prober(config: AgentConfig, engine: DockerEngine, compose_command: list[str] | None) -> Prober:
    return Prober(NvmlProbe(config.nvml_library), engine, compose_command, gpu_check_image=config.gpu_check_image,
                  toolkit_config=config.toolkit_config, location=config.location)


def build_agent(config: AgentConfig, base_url: str, api_key: str) -> AgentParts:
    SECRETS.add(api_key)
    db = AgentDB(config.state_dir / DB_FILE)
    client = MarketplaceClient(base_url, api_key)
    outbox = Outbox(lambda report: send_report(client, report), db=db)
    engine = DockerEngine()
    compose = ComposeRunner(None, config.state_dir / "docker-config",
                            finder=lambda: find_compose_command(config.compose_command))
    schedule = Schedule()
    host = HostReporter(client, outbox, build_prober(config, engine, None), schedule,
                        lambda: find_compose_command(config.compose_command),
                        speed_max_bytes=config.speed_max_bytes, speed_max_seconds=config.speed_max_seconds)
    host.compose_found = lambda command: setattr(compose, "command", command)
    publish = config.publish_address or ("127.0.0.1" if config.uses_local_marketplace else "0.0.0.0")
    ledger = GpuLedger(db)
    ledger.import_legacy(config.state_dir / "gpu-assignments.json")
    sandbox = Sandbox(ledger, host.machine_facts, publish_address=publish, pids_limit=config.pids_limit)
    deployer = StackDeployer(compose, engine, outbox, config.state_dir / "stacks", sandbox=sandbox, db=db,
                             settle_seconds=config.settle_seconds, stop_timeout=config.stop_timeout)
    dispatcher = JobDispatcher(deployer, outbox, db)
    agent = Agent(client, deployer, outbox, dispatcher, schedule, host)
    env_id = lambda: agent.env_id  # noqa: E731 - known once the session is open
    rental_clock = RentalClock(db, dispatcher, ledger, env_id)
    reconciler = Reconciler(client, engine, dispatcher, deployer, db, ledger, outbox, env_id,
                            grace_seconds=config.reconcile_grace_seconds, note_end_date=rental_clock.end_date)
    agent.attach_durability(reconciler, rental_clock, EngineWatch(engine))
    agent.attach_streams(StreamChannel(client, env_id))
    if db.rebuilt_because and db.rebuilt_because != "no state file yet":
        log.warning("state_rebuilding", reason=db.rebuilt_because)
    return AgentParts(agent, client, outbox, dispatcher, engine, host, db, reconciler)


async def start_local_marketplace(config: AgentConfig) -> local_server.RunningMarketplace:
    store = Store.load_or_create(config.state_dir / "local-marketplace.json", config.local_api_key)
    SECRETS.add(store.envApiKey, store.renterApiKey)
    host, port = config.local_listen
    return await local_server.start(MarketplaceState(store), host, port)

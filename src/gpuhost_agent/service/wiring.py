"""The composition root: the one place that builds the agent's objects and
hands each its collaborators. Everything else receives what it needs.

With no marketplace configured, the local marketplace is built here too, and
the agent talks to it over real HTTP on loopback, as to the real one.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhost_agent import __version__
from gpuhost_agent.common.logs import SECRETS, get_logger
from gpuhost_agent.core import upgrade_offers
from gpuhost_agent.core.agent import Agent, AgentDuties, AgentWatchers, MarketplaceSide
from gpuhost_agent.core.containers.watch import ContainerWatch
from gpuhost_agent.core.disk_watch import DiskWatch, DiskWatchParts, DiskWatchSettings
from gpuhost_agent.core.egress_keeper import EgressKeeper
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.host_reporter import HostReporter, HostReporterParts, HostReportSettings
from gpuhost_agent.core.images.cache import ImageCache
from gpuhost_agent.core.images.disk_fit import DiskRoom
from gpuhost_agent.core.images.pulls import ImagePulls
from gpuhost_agent.core.images.pulls_elsewhere import PullsElsewhere
from gpuhost_agent.core.reconcile.engine_recovery import EngineRecovery
from gpuhost_agent.core.reconcile.reconciler import Reconciler, ReconcileSources, ReconcileTools
from gpuhost_agent.core.rental_clock import RentalClock
from gpuhost_agent.core.rentals.end_dates import RentalEndDates
from gpuhost_agent.core.rentals.usage_meter import UsageMeter
from gpuhost_agent.core.sandbox.apply import Sandbox, SandboxParts, SandboxRules
from gpuhost_agent.core.sandbox.host_network import allows
from gpuhost_agent.core.schedule import Schedule
from gpuhost_agent.core.stacks.deployer import DeployParts, DeploySettings, StackDeployer
from gpuhost_agent.core.stacks.dispatcher import JobDispatcher
from gpuhost_agent.core.stacks.gpu_faults import GpuFaults
from gpuhost_agent.core.stacks.status_reporter import StatusReporter
from gpuhost_agent.inventory import driver_cdi, telemetry
from gpuhost_agent.inventory.gpu_events import GpuEventWatch
from gpuhost_agent.inventory.nvml_probe import NvmlProbe
from gpuhost_agent.protocol.wire_system import SystemData
from gpuhost_agent.runtime.compose import ComposeRunner, find_compose_command
from gpuhost_agent.runtime.engine.client import DockerEngine
from gpuhost_agent.runtime.engine.watch import EngineWatch
from gpuhost_agent.runtime.host_firewall import HostFirewall
from gpuhost_agent.runtime.image_manifest import ManifestSizes
from gpuhost_agent.runtime.image_pull import pull_image
from gpuhost_agent.service import metrics
from gpuhost_agent.service.agent_parts import AgentParts
from gpuhost_agent.service.config import AgentConfig
from gpuhost_agent.service.probe_parts import build_prober, guard_key_file
from gpuhost_agent.service.status.server import StatusServer, StatusSource
from gpuhost_agent.service.topology import for_config
from gpuhost_agent.service.upgrades import Upgrades, supervised
from gpuhost_agent.storage.agent_db import DB_FILE, AgentDB
from gpuhost_agent.streams.channel import StreamChannel
from gpuhost_agent.streams.pull_guard import PullGuard, new_key
from gpuhost_agent.streams.ssh import host_key as ssh_host_key
from gpuhost_agent.streams.ssh.access import RentalKeys, SshServices
from gpuhost_agent.streams.tunnel import read_host_networks
from gpuhost_agent.uplink.client import MarketplaceClient
from gpuhost_agent.uplink.outbox import Outbox
from gpuhost_agent.uplink.session import SessionState

if TYPE_CHECKING:
    from gpuhost_agent.local_marketplace.server import RunningMarketplace

log = get_logger(__name__)


def upgrade_policy(config: AgentConfig, release_key: str | None = None) -> upgrade_offers.Policy:
    """What the host decided of upgrades; `release_key`: the local
    marketplace's own key (the agent that embeds it trusts it), else the
    pinned file's (read here; judged when an offer comes)."""
    problem = None
    if release_key is None:
        try:
            release_key = config.release_key_file.read_text()
            problem = key_file_problem(config.release_key_file)
        except OSError as exc:
            problem = f"no release key is pinned on this host ({config.release_key_file}: {exc.strerror})"
    if problem or release_key is None:
        return upgrade_offers.Policy(config.upgrades, None, problem or "", config.upgrade_allow_version)
    return upgrade_offers.Policy(config.upgrades, release_key.strip(), "", config.upgrade_allow_version)


def key_file_problem(path: Path) -> str | None:
    """Whoever can write the release key decides what runs as root: it and its
    folders must be the agent's user's (root's) alone to change, as sshd asks of its keys."""
    me = os.geteuid()
    for part in (path, *path.parents):
        info = part.stat()
        if info.st_uid not in (0, me) or info.st_mode & 0o022:
            return f"the release key {path} is not pinned: {part} may be changed by another user than root"
    return None


def build_agent(config: AgentConfig, base_url: str, api_key: str, release_key: str | None = None) -> AgentParts:
    """Every object of a running agent, each given its collaborators here and
    nowhere else, in the order of their dependencies: nothing is attached later.
    `release_key`: the local marketplace's, when the agent embeds it."""
    SECRETS.add(api_key, config.swarm_key)
    db = AgentDB(config.state_dir / DB_FILE)
    if db.rebuilt_because and db.rebuilt_because != "no state file yet":
        log.warning("state_rebuilding", reason=db.rebuilt_because)
    session = SessionState(env_id=db.meta("env_id"))  # rentals end on time even before the first session
    client = MarketplaceClient(base_url, api_key)
    outbox = Outbox(client.send_report, db)
    nvml = NvmlProbe(config.nvml_library)
    find_compose = partial(find_compose_command, config.compose_command)
    compose = ComposeRunner(None, config.state_dir / "docker-config", finder=find_compose)
    schedule = Schedule()
    ledger = GpuLedger(db)
    ledger.import_legacy(config.state_dir / "gpu-assignments.json")
    topology = for_config(config, compose.docker_config_dir)
    engine, stream_engine = topology.engine, topology.stream_engine
    cdi = partial(driver_cdi.keep, driver_root=config.driver_root)
    prober = build_prober(config, engine, nvml, None, topology.machines, cdi=cdi)
    host = HostReporter(
        parts=HostReporterParts(
            client=client,
            outbox=outbox,
            prober=prober,
            schedule=schedule,
            find_compose=find_compose,
            compose_found=compose.use,
            ledger=ledger,
        ),
        settings=HostReportSettings(speed_max_bytes=config.speed_max_bytes, speed_max_seconds=config.speed_max_seconds),
    )
    publish = config.publish_address or ("127.0.0.1" if config.uses_local_marketplace else "0.0.0.0")
    reporter = StatusReporter(outbox, db, ledger)
    limit_reached = topology.shares.memory_limit_reached
    sandbox = Sandbox(
        parts=SandboxParts(
            ledger=ledger,
            machine_facts=host.machine_facts,
            shares=topology.shares,
            placement=topology.placement,
            images_absent=engine.missing_images,
        ),
        rules=SandboxRules(
            publish_address=publish,
            pids_limit=config.pids_limit,
            log_max_size=config.log_max_size,
            log_max_files=config.log_max_files,
            disk_floor_bytes=config.disk_floor_bytes,
            rental_disk_bytes=config.rental_disk_bytes,
            allowed_registries=config.allowed_registries,
            opened_networks=config.egress_allow,
        ),
    )
    stacks = topology.stack_backend(compose, config.stop_timeout)
    deployer = StackDeployer(
        parts=DeployParts(
            backend=stacks,
            engine=engine,
            reporter=reporter,
            sandbox=sandbox,
            db=db,
            images=image_pulls(config, engine, compose.docker_config_dir, host.machine_facts, ledger)
            if topology.pulls_here
            else PullsElsewhere(),
            rental_limit_reached=limit_reached,
        ),
        settings=DeploySettings(
            stacks_dir=config.state_dir / "stacks",
            home_dir=compose.home_dir,
            settle_seconds=config.settle_seconds,
            stop_timeout=config.stop_timeout,
            stacks_per_rental=config.stacks_per_rental,
        ),
    )
    ssh = SshServices(
        stream_engine,
        RentalKeys(client.rental_ssh_keys),
        ssh_host_key.load_or_create(config.state_dir),
        list_stack=topology.list_stack,
    )
    streams = StreamChannel(client, session, stream_engine, ssh)
    end_dates = RentalEndDates(db)
    dispatcher = JobDispatcher(
        deployer,
        reporter,
        outbox,
        db,
        end_dates,
        streams.end_rental,
        metrics.deploy_histogram(),
        deploy_concurrency=config.deploy_concurrency,
    )
    rental_clock = RentalClock(end_dates, dispatcher, ledger, session)
    reconciler = Reconciler(
        sources=ReconcileSources(client=client, session=session, engine=engine, db=db, ledger=ledger, outbox=outbox),
        tools=ReconcileTools(
            dispatcher=dispatcher, reporter=reporter, end_dates=end_dates, keep_limits=sandbox.keep_limits
        ),
        grace_seconds=config.reconcile_grace_seconds,
    )
    container_watch = ContainerWatch(
        engine,
        reporter,
        db,
        dispatcher,
        rental_limit_reached=limit_reached,
        machines=topology.machines,
    )
    disk_watch = DiskWatch(
        parts=DiskWatchParts(
            engine=engine,
            db=db,
            ledger=ledger,
            reporter=reporter,
            machine_facts=host.machine_facts,
            busy_rentals=dispatcher.busy_rentals,
            machines=topology.machines,
            stacks=stacks,
        ),
        settings=DiskWatchSettings(
            interval=config.disk_watch_seconds,
            floor_bytes=config.disk_floor_bytes,
            rental_disk_bytes=config.rental_disk_bytes,
        ),
    )
    gpu_events = GpuEventWatch(nvml, GpuFaults(ledger, db, reporter).fault)
    usage = UsageMeter(
        db,
        ledger,
        outbox.put,
        partial(asyncio.to_thread, telemetry.gpu_busy, nvml),
        boot_time=telemetry.boot_time(),
        clock=time.time,
        interval=config.usage_seconds,
    )
    ledger.on_change.append(usage.count)  # an assignment or a release counts to the second
    engine_watch = EngineWatch(engine, EngineRecovery(reconciler, container_watch, session).engine_back)
    restart = asyncio.Event()
    upgrades = Upgrades(
        config.state_dir,
        client,
        __version__,
        config.upgrade_health_seconds,
        restart,
        supervised=supervised(),
        policy=upgrade_policy(config, release_key),
    )
    host.heartbeat_replies.append(upgrades.offered)  # a release offered at a beat, not only at a session
    host.beat_facts.append(upgrades.session_info)  # and a confirmed upgrade told at once
    agent = Agent(
        marketplace=MarketplaceSide(client=client, session=session, outbox=outbox, streams=streams, releases=upgrades),
        duties=AgentDuties(
            db=db,
            dispatcher=dispatcher,
            schedule=schedule,
            host=host,
            reconciler=reconciler,
            rental_clock=rental_clock,
        ),
        watchers=AgentWatchers(
            engine_watch=engine_watch,
            container_watch=container_watch,
            disk_watch=disk_watch,
            gpu_events=gpu_events,
            usage=usage,
            egress=EgressKeeper(HostFirewall(), config.egress_allow, openings=config.engine_openings),
            watches=topology.watches(container_watch, lambda: session.env_id, host.environment_changed),
        ),
    )
    return AgentParts(
        agent,
        session,
        client,
        outbox,
        dispatcher,
        deployer,
        engine,
        nvml,
        host,
        db,
        reconciler,
        engine_watch,
        streams,
        reporter=reporter,
        upgrades=upgrades,
        restart=restart,
        ledger=ledger,
        disk_watch=disk_watch,
    )


def image_pulls(
    config: AgentConfig,
    engine: DockerEngine,
    docker_config_dir: Path,
    machine_facts: Callable[[], Awaitable[SystemData]],
    ledger: GpuLedger,
) -> ImagePulls:
    """Renters' images pulled by the agent, with progress, checked to fit first (one machine)."""
    room = DiskRoom(
        machine_facts, ledger, floor_bytes=config.disk_floor_bytes, rental_disk_bytes=config.rental_disk_bytes
    )
    return ImagePulls(
        pull_image,
        stall_seconds=config.pull_stall_seconds,
        max_seconds=config.pull_max_seconds,
        sizes=ManifestSizes(
            engine, docker_config_dir, timeout=config.pull_stall_seconds, guard=guard_url(config.pull_guard)
        ).size,
        room=room.room,
        cache=ImageCache(engine, config.state_dir / "images.json", room.free),
    )


async def start_local_marketplace(config: AgentConfig) -> RunningMarketplace:
    """The embedded marketplace, imported only here: an agent with a real
    marketplace never loads it (nor asyncssh, which it checks keys with)."""
    from gpuhost_agent.local_marketplace import server as local_server
    from gpuhost_agent.local_marketplace.install_release import InstallRelease, running_checkout
    from gpuhost_agent.local_marketplace.releases import Release
    from gpuhost_agent.local_marketplace.state import MarketplaceState
    from gpuhost_agent.local_marketplace.store import Store

    store = Store.load_or_create(config.state_dir / "local-marketplace.json", config.local_api_key)
    SECRETS.add(store.envApiKey, store.renterApiKey)
    host, port = config.local_listen
    state = MarketplaceState(store)
    if config.local_release_wheel is not None:
        state.release = await asyncio.to_thread(Release.of_wheel, config.local_release_wheel)
    built_in = config.state_dir / "local-release"  # the checkout's wheel, built when first asked for
    checkout = await asyncio.to_thread(running_checkout)
    state.install_release = InstallRelease(lambda: state.release, checkout, built_in)
    return await local_server.start(state, host, port)


async def start_status_server(
    parts: AgentParts,
    socket_path: Path,
    *,
    metrics_enabled: bool = False,
    metrics_listen: tuple[str, int] | None = None,
    local_marketplace: bool = False,
    started_at: float | None = None,
    settings: list[dict[str, str]] | None = None,
) -> StatusServer:
    """The status socket (and /metrics) of a built agent; `await server.stop()` at shutdown.
    `settings`: the view of the settings it started with, served at /settings for doctor."""
    source = StatusSource(
        parts,
        started_at=started_at,
        metrics_enabled=metrics_enabled,
        local_marketplace=local_marketplace,
        settings=settings,
    )
    server = StatusServer(source, socket_path, metrics_listen)
    await server.start()
    return server


def guard_url(listen: tuple[str, int] | None) -> str | None:
    """The pull guard's address as a proxy URL, or None when it is off."""
    if listen is None:
        return None
    host, port = listen
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def start_pull_guard(config: AgentConfig) -> asyncio.Server | None:
    """The proxy dockerd's pulls go through (streams/pull_guard.py), on
    GPUHOST_PULL_GUARD; None when it is off or cannot listen (logged as an
    error: compliance's `registry-pulls-guarded` fails and says why)."""
    if config.pull_guard is None:
        log.warning("pull_guard_off", setting="GPUHOST_PULL_GUARD", risk="dockerd resolves renters' registries itself")
        return None

    async def host_networks() -> list:
        return await asyncio.to_thread(read_host_networks)

    opened = tuple(ipaddress.ip_network(net, strict=False) for net in config.egress_allow)
    key = await asyncio.to_thread(new_key, guard_key_file(config))
    guard = PullGuard(
        allows(config.allowed_registries), host_networks, upstream=config.pull_guard_upstream, opened=opened, key=key
    )
    host, port = config.pull_guard
    try:
        server = await guard.serve(host, port)
    except OSError as exc:
        log.error(
            "pull_guard_not_listening",
            listen=f"{host}:{port}",
            error=str(exc),
            fix="free the port, or set GPUHOST_PULL_GUARD to another loopback address and Docker's proxy with it",
        )
        return None
    log.info("pull_guard_listening", listen=f"{host}:{port}", upstream=config.pull_guard_upstream)
    return server

"""The agent on a machine of a Swarm environment that is not the leader
(GPUHOST_SWARM=worker, docs/swarm.md).

The leader holds the marketplace session, the GPU ledger and the deploys;
what only this machine can do for a renter's container here (a terminal,
SSH, a tunnel's last hop) it asks of this agent, through the door in
streams/door.py, over mutual TLS (service/swarm_tls.py) with the
environment's key; and this agent reports
this machine (its GPUs, engine, toolkit, disk and clock) when the leader
asks, for the environment's systemData and compliance; and it keeps this
machine's egress rules, as every agent does (core/egress_keeper.py), since
renters' containers run here. So a worker runs no session, keeps no state
database and deploys nothing: it serves that door until it is stopped, and
tells systemd it is ready once the door listens, on this machine's Swarm
address alone (GPUHOST_SWARM_LISTEN names another, never every address).
"""

from __future__ import annotations

import asyncio
import os
import ssl
from functools import partial
from pathlib import Path

from gpuhost_agent.common.logs import SECRETS, get_logger
from gpuhost_agent.core.egress_keeper import EgressKeeper
from gpuhost_agent.inventory.machine_report import MachineReport
from gpuhost_agent.runtime.compose import ComposeNotFound, find_compose_command
from gpuhost_agent.runtime.docker_host import parse_docker_host
from gpuhost_agent.runtime.engine.client import DockerEngine
from gpuhost_agent.runtime.engine.records import DiskUsage
from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.runtime.host_firewall import HostFirewall
from gpuhost_agent.runtime.swarm_stacks import rental_disk_figures
from gpuhost_agent.service import sd_notify, swarm_tls
from gpuhost_agent.service.config import AgentConfig
from gpuhost_agent.service.probe_parts import build_probe
from gpuhost_agent.service.wiring import start_pull_guard
from gpuhost_agent.streams.door import WorkerDoor

log = get_logger(__name__)


async def serve_worker(config: AgentConfig, stop: asyncio.Event) -> None:
    assert config.swarm_key, "checked by the configuration"
    SECRETS.add(config.swarm_key)
    engine_path = parse_docker_host(os.environ.get("DOCKER_HOST")).unix_path
    if engine_path is None:
        raise SystemExit("GPUHOST_SWARM=worker needs the engine on a unix:// socket (DOCKER_HOST)")
    engine = EngineStreams()
    try:
        compose = await asyncio.to_thread(find_compose_command, config.compose_command)
    except ComposeNotFound:
        compose = None  # reported as such: the leader deploys, but doctor checks every machine
    probe = build_probe(config, compose)
    report = MachineReport(probe.prober)
    disk_engine = DockerEngine()  # `GET /system/df` may take longer than a probe's calls

    async def disk_figures() -> DiskUsage:
        return rental_disk_figures(await disk_engine.disk_usage())

    async def networks() -> list[dict]:
        return await disk_engine.swarm_list("networks")

    async def leaders() -> frozenset[str]:  # the Swarm's managers: where the leader's connections come from
        managers = ((await disk_engine.info()).get("Swarm") or {}).get("RemoteManagers") or []
        return frozenset(
            manager_host(str(manager.get("Addr") or "")) for manager in managers if isinstance(manager, dict)
        )

    # Renters' containers run here too: their egress rules first, then kept every minute.
    egress = EgressKeeper(HostFirewall(), config.egress_allow, openings=config.engine_openings)
    await egress.run_once()
    keeping = asyncio.create_task(_keep(egress), name="egress-keeper")
    guard = await start_pull_guard(config)  # this machine's dockerd pulls the tasks' images
    tls = swarm_tls.context_or_exit("worker", config.swarm_tls_dir)
    proxy = WorkerDoor(
        config.swarm_key,
        engine,
        engine_path,
        machine=report,
        disk=disk_figures,
        networks=networks,
        tls=tls,
        leaders=leaders,
        crl=partial(_newer_crl, config.swarm_tls_dir),
    )
    host, port = config.swarm_listen
    if not host:  # this machine's Swarm address: where the leader finds it, never a bridge of containers
        host = str(((await disk_engine.info()).get("Swarm") or {}).get("NodeAddr") or "")
        if not host:
            raise SystemExit("GPUHOST_SWARM=worker: this engine is in no Swarm; set GPUHOST_SWARM_LISTEN=ADDRESS:PORT")
    try:
        port = await proxy.start(host, port)
    except OSError as exc:
        raise SystemExit(f"GPUHOST_SWARM_LISTEN={host}:{port}: cannot listen ({exc.strerror or exc})") from None
    watchdog = sd_notify.Watchdog()
    watchdog.start()
    sd_notify.ready(f"Swarm worker: serving the leader on {host}:{port}")
    log.info("swarm_worker_started", listen=f"{host}:{port}", engine=engine_path)
    first_probe = asyncio.create_task(report.probe())  # ready before the leader asks
    try:
        await stop.wait()
    finally:
        first_probe.cancel()
        keeping.cancel()
        await asyncio.gather(first_probe, keeping, return_exceptions=True)
        await report.close()
        sd_notify.stopping("stopping")
        await proxy.stop()
        if guard is not None:
            guard.close()
        await engine.close()
        await disk_engine.close()
        await probe.close()
        await watchdog.stop()
        log.info("swarm_worker_stopped", served=proxy.served, refused=proxy.refused)


def _newer_crl(directory: Path, listed: str) -> ssl.SSLContext | None:
    """The door's context anew when the leader's list is newer than the one held. Blocking."""
    return swarm_tls.server_context(directory) if swarm_tls.accept_crl(directory, listed.encode()) else None


async def _keep(egress: EgressKeeper) -> None:
    while True:
        await asyncio.sleep(egress.interval)
        await egress.run_once()


def manager_host(addr: str) -> str:
    """The address of a manager's `Addr` (`10.0.0.1:2377`, `[fd00::1]:2377`)."""
    host = addr.rsplit(":", 1)[0] if addr.count(":") == 1 or addr.startswith("[") else addr
    return host.strip("[]")

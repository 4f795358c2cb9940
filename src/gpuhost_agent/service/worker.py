"""The agent on a machine of a Swarm environment that is not the leader
(GPUHOST_SWARM=worker, docs/swarm.md).

The leader holds the marketplace session, the GPU ledger and the deploys;
what only this machine's engine can do for a renter's container here (a
terminal) it asks of this agent, through the door in streams/node_proxy.py,
with the environment's key. So a worker runs no session, keeps no state
database and deploys nothing: it serves that door until it is stopped, and
tells systemd it is ready once the door listens.
"""

from __future__ import annotations

import asyncio
import os

from gpuhost_agent.common.logs import SECRETS, get_logger
from gpuhost_agent.runtime.docker_host import parse_docker_host
from gpuhost_agent.runtime.engine_streams import EngineStreams
from gpuhost_agent.service import sd_notify
from gpuhost_agent.service.config import AgentConfig
from gpuhost_agent.streams.node_proxy import NodeProxy

log = get_logger(__name__)


async def serve_worker(config: AgentConfig, stop: asyncio.Event) -> None:
    assert config.swarm_key, "checked by the configuration"
    SECRETS.add(config.swarm_key)
    engine_path = parse_docker_host(os.environ.get("DOCKER_HOST")).unix_path
    if engine_path is None:
        raise SystemExit("GPUHOST_SWARM=worker needs the engine on a unix:// socket (DOCKER_HOST)")
    engine = EngineStreams()
    proxy = NodeProxy(config.swarm_key, engine, engine_path)
    host, port = config.swarm_listen
    try:
        port = await proxy.start(host, port)
    except OSError as exc:
        raise SystemExit(f"GPUHOST_SWARM_LISTEN={host}:{port}: cannot listen ({exc.strerror or exc})") from None
    watchdog = sd_notify.Watchdog()
    watchdog.start()
    sd_notify.ready(f"Swarm worker: serving the leader on {host}:{port}")
    log.info("swarm_worker_started", listen=f"{host}:{port}", engine=engine_path)
    try:
        await stop.wait()
    finally:
        sd_notify.stopping("stopping")
        await proxy.stop()
        await engine.close()
        await watchdog.stop()
        log.info("swarm_worker_stopped", served=proxy.served, refused=proxy.refused)

"""`gpuhost-agent run`: start what the composition root built, run until told
to stop, and shut down in a bounded time with renters' containers left running.
"""

from __future__ import annotations

import asyncio
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.service import sd_notify
from gpuhost_agent.service.agent_parts import AgentParts
from gpuhost_agent.service.config import AgentConfig, SwarmRole, default_of
from gpuhost_agent.service.settings_table import SETTINGS
from gpuhost_agent.service.state_lock import StateLock
from gpuhost_agent.service.wiring import build_agent, start_local_marketplace, start_pull_guard, start_status_server

if TYPE_CHECKING:  # the embedded marketplace is imported only when it runs (service/wiring.py)
    from gpuhost_agent.local_marketplace.server import RunningMarketplace

log = get_logger(__name__)
SHUTDOWN_FLUSH = 3.0
SECRET_FIELDS = frozenset(str(setting.field) for setting in SETTINGS if setting.secret)  # never logged


async def stop_agent(
    parts: AgentParts, agent_task: asyncio.Task, job_grace: float = default_of("shutdown_grace_seconds")
) -> None:
    """Finish or abandon jobs in a bounded time (job_grace, then at most 5 s for
    the abandoned ones to unwind, and SHUTDOWN_FLUSH for reports), and leave
    renters' containers running. What is not flushed stays in the state
    database and goes out after the next start; an abandoned job is handed out
    again by the marketplace and converges."""
    await parts.dispatcher.shutdown(job_grace)
    if not await parts.outbox.drained(SHUTDOWN_FLUSH):
        log.warning("reports_unsent_at_shutdown", pending=parts.outbox.pending())
    agent_task.cancel()
    await asyncio.gather(agent_task, return_exceptions=True)
    await parts.client.close()
    await parts.engine.close()
    parts.nvml.close()
    parts.db.close()


async def serve(config: AgentConfig, stop: asyncio.Event, settings: list[dict[str, str]] | None = None) -> None:
    config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = StateLock(config.state_dir)
    lock.take()  # before the banner and the session: a second agent on this state stops here
    try:
        await _serve_locked(config, stop, settings)
    finally:
        lock.release()


async def _serve_locked(config: AgentConfig, stop: asyncio.Event, settings: list[dict[str, str]] | None) -> None:
    if config.swarm is SwarmRole.WORKER:  # another machine of a Swarm environment: it serves the leader only
        from gpuhost_agent.service.swarm_worker import serve_worker

        await serve_worker(config, stop)
        return
    local = None
    if config.uses_local_marketplace:
        local = await start_local_marketplace(config)
        base_url, api_key = local.base_url, local.state.store.envApiKey
        release_key: str | None = local.state.release_public_key()
        _print_local_banner(local, config)
    else:
        base_url, api_key, release_key = str(config.marketplace_url), str(config.api_key), None
    parts = build_agent(config, base_url, api_key, release_key)
    guard = await start_pull_guard(config)
    status = await start_status_server(
        parts,
        config.socket_path,
        metrics_enabled=config.metrics,
        metrics_listen=config.metrics_listen,
        local_marketplace=config.uses_local_marketplace,
        settings=settings,
    )
    agent_task = asyncio.create_task(parts.agent.run(), name="agent")
    watchdog = sd_notify.Watchdog()
    watchdog.start()
    ready_task = asyncio.create_task(
        sd_notify.notify_ready_when(parts.session.connected, f"connected to {base_url}"), name="sd-ready"
    )
    trial_task = asyncio.create_task(parts.upgrades.confirm_when_healthy(parts.trial_health), name="upgrade-trial")
    log.info("agent_started", marketplace=base_url, state_dir=str(config.state_dir))
    stop_task = asyncio.create_task(stop.wait())
    restart_task = asyncio.create_task(parts.restart.wait())
    done, _ = await asyncio.wait({agent_task, stop_task, restart_task}, return_when=asyncio.FIRST_COMPLETED)
    if agent_task in done:
        stop_task.cancel()
        restart_task.cancel()
        await status.stop()
        agent_task.result()  # re-raise what stopped the agent
    for task in (ready_task, trial_task, stop_task, restart_task):
        task.cancel()
    await parts.upgrades.stop()
    why = "upgrade: systemd starts the new version" if restart_task in done else "signal"
    sd_notify.stopping("stopping: finishing jobs; containers keep running")
    log.info("agent_stopping", reason=why)
    await status.stop()  # before stop_agent: it closes the database /status reads
    await stop_agent(parts, agent_task, config.shutdown_grace_seconds)
    if local is not None:
        await local.stop()
    if guard is not None:
        guard.close()
    log.info("agent_stopped", containers="left running")
    await watchdog.stop()


def _print_local_banner(local: RunningMarketplace, config: AgentConfig) -> None:
    store = local.state.store
    print(
        "gpuhost-agent: no marketplace configured, serving the local marketplace\n"
        f"  base URL:        {local.base_url}\n"
        f"  environment id:  {store.envId}\n"
        f"  renter API key:  {store.renterApiKey}\n"
        f"  state directory: {config.state_dir}\n"
        f"  status:          {status_command(config)}\n"
        f"  try: curl -s -H 'X-API-Key: {store.renterApiKey}' {local.base_url}/environments",
        file=sys.stdout,
        flush=True,
    )


def status_command(config: AgentConfig, program: str | None = None) -> str:
    """The `status` command that reads this agent: this program as it was
    started (`make run` starts .venv/bin/gpuhost-agent, which is on no PATH),
    and its state directory or socket, which a plain `gpuhost-agent status`
    would not look in (it looks in the system service's first)."""
    started = Path(program or sys.argv[0])
    if started.name == "__main__.py":  # python -m gpuhost_agent
        command = f"{shlex.quote(sys.executable)} -m gpuhost_agent"
    elif started.name == "gpuhost-agent":
        command = shlex.quote(str(started.absolute()))
    else:
        command = "gpuhost-agent"
    if config.socket_path == config.state_dir / "agent.sock":
        return f"{command} status --state-dir {shlex.quote(str(config.state_dir))}"
    return f"{command} status --socket {shlex.quote(str(config.socket_path))}"


def run(
    config: AgentConfig,
    reload: Callable[[], AgentConfig] | None = None,
    settings: list[dict[str, str]] | None = None,
) -> int:
    """Run until SIGTERM/SIGINT. SIGHUP re-reads the configuration (`reload`,
    by default the config file and environment without the command line's
    flags) and applies what can change at run time: the log level."""
    from gpuhost_agent.common import logs
    from gpuhost_agent.service import config as config_module

    reread = reload or (lambda: config_module.load({}))

    def on_sighup() -> None:
        try:
            fresh = reread()
            logs.set_level(fresh.log_level)
        except (config_module.ConfigError, ValueError, OSError) as exc:
            log.error("config_reload_failed", error=str(exc), log_level=config.log_level)
            return
        # Only the level changes at run time; other edits wait for a restart.
        # (Without `reload` the flags are not re-read, so a difference may be a flag.)
        unapplied = (
            sorted(
                name for name in vars(fresh) if name != "log_level" and getattr(fresh, name) != getattr(config, name)
            )
            if reload
            else []
        )
        config.log_level = fresh.log_level
        log.info("config_reloaded", log_level=fresh.log_level, restart_needed_for=unapplied or None)
        log.debug(
            "config_in_effect",
            **{name: str(value) for name, value in vars(config).items() if name not in SECRET_FIELDS},
        )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        loop.add_signal_handler(signal.SIGHUP, on_sighup)
        await serve(config, stop, settings)

    asyncio.run(main())
    return 0

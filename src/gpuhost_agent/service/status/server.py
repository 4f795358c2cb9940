"""The running agent's local status endpoint, on a Unix socket only root can open.

`GET /status` answers what `gpuhost-agent status` shows (JSON); `GET /metrics`
answers Prometheus text when metrics are enabled (404 otherwise), on the same
socket and, when configured, on a loopback TCP address as well.

The socket is created with mode 0600 (a restrictive umask around its creation,
then chmod) in a directory created 0700 when missing. Everything it answers is
read from the agent's parts as they are; nothing here changes the agent.
Strings pass through the secret scrubber, like log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from aiohttp import web

from gpuhost_agent import __version__
from gpuhost_agent.common.logs import LAST_ERROR, SECRETS, get_logger
from gpuhost_agent.errors import OutsideFailure
from gpuhost_agent.protocol import wire_time
from gpuhost_agent.service import metrics
from gpuhost_agent.service.agent_parts import AgentParts
from gpuhost_agent.service.status.stacks import stack_entries

log = get_logger(__name__)
SOCKET_NAME = "agent.sock"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL


class StatusSocketError(OutsideFailure, OSError):
    """The status socket cannot be set up; the message says why."""


# ---- what /status and /metrics answer ------------------------------------------------
def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return SECRETS.scrub(value)
    if isinstance(value, dict):
        return {key: _scrub(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub(item) for item in value]
    return value


class StatusSource:
    """Asks each part of a running agent for its own `stats()` (and a few
    read-only accessors: the compliance verdict, the stacks' names, container
    lists and open streams) and puts the answers together; nothing here
    reaches inside a part."""

    def __init__(
        self,
        parts: AgentParts,
        *,
        started_at: float | None = None,
        metrics_enabled: bool = False,
        local_marketplace: bool = False,
        last_error: Callable[[], dict | None] = LAST_ERROR.get,
        settings: list[dict[str, str]] | None = None,
    ):
        self.parts = parts
        self.settings = settings or []  # the settings it started with (settings_view.py), keys masked
        self.started_at = time.time() if started_at is None else started_at
        self._started_monotonic = time.monotonic() - (time.time() - self.started_at)
        self.metrics_enabled = metrics_enabled
        self.local_marketplace = local_marketplace
        self.last_error = last_error

    def status(self) -> dict:
        parts = self.parts
        session, host = parts.session.stats(), parts.host.stats()
        # The marketplace's names: from this start's jobs, and from its last desired
        # state (which names the stacks deployed before this start as well).
        names = {**parts.reporter.names(), **parts.reconciler.stack_names}
        stacks = stack_entries(parts.db.stacks(), names, parts.reporter.last_containers, parts.streams.open_requests())
        rentals = [
            {
                "rentalId": rental_id,
                "endDate": row.get("end_date"),
                "gpus": row.get("gpus") or [],
                "endedAt": row.get("ended_at"),
            }
            for rental_id, row in sorted(parts.db.rentals().items())
            if not row.get("ended_at")
        ]
        body = {
            "running": True,
            "pid": os.getpid(),
            "version": __version__,
            "since": wire_time.iso_from_timestamp(self.started_at),
            "uptimeSeconds": round(time.time() - self.started_at, 1),
            **session,
            **parts.client.stats(),
            "localMarketplace": self.local_marketplace,
            **host,
            "lastError": self.last_error(),
            "compliance": parts.host.compliance(),
            "stacks": stacks,
            "rentals": rentals,
            "jobs": parts.dispatcher.stats(),
            "reports": parts.outbox.stats(),
            "engine": parts.engine_watch.stats(),
            "reconcile": parts.reconciler.stats(),
            "streams": parts.streams.stats(),
            "metricsEnabled": self.metrics_enabled,
        }
        return _scrub(body)

    async def metric_figures(self) -> dict:
        parts = self.parts
        try:
            gpus = await asyncio.to_thread(parts.nvml.telemetry)
        except Exception:  # NVML trouble must not break the scrape
            log.exception("metrics_gpu_telemetry_failed")
            gpus = []
        session, dispatcher, engine = parts.session.stats(), parts.dispatcher.stats(), parts.engine_watch.stats()
        return {
            "uptime_seconds": round(time.monotonic() - self._started_monotonic, 3),
            "connected": session["connected"],
            "jobs": dispatcher["outcomes"],
            "jobs_running": dispatcher["running"],
            "deploy_durations": parts.dispatcher.deploy_durations,
            "reports": parts.outbox.stats(),
            "reconnects": session["reconnects"],
            "engine_up": engine["up"],
            "engine_outages": engine["outages"],
            "reconcile_runs": parts.reconciler.stats()["runs"],
            "gpus": gpus,
            "heartbeat_last_at": parts.host.stats()["heartbeat"]["lastAt"],
            "gpus_out_of_service": dict(parts.ledger.out_of_service) if parts.ledger else {},
            "compliance": parts.host.compliance(),
            "rentals_over_disk_share": len(parts.disk_watch.last_over) if parts.disk_watch else None,
            "upgrade_last_attempt": parts.upgrades.record["lastAttempt"],
        }

    async def metrics_response(self, _request: web.Request) -> web.Response:
        """/metrics, on the socket and on loopback TCP alike."""
        if not self.metrics_enabled:
            raise web.HTTPNotFound(text="metrics are off (set GPUHOST_METRICS=on)\n")
        response = web.Response(body=metrics.render(await self.metric_figures()))
        response.headers["Content-Type"] = metrics.CONTENT_TYPE
        return response


def process_figures() -> dict:
    """The agent process's own footprint, which months of churn must leave flat
    (bench/soak.py judges it). Blocking (/proc reads): run it in a thread."""
    me = psutil.Process()
    with me.oneshot():
        return {"rssBytes": me.memory_info().rss, "openFiles": me.num_fds(), "threads": me.num_threads()}


def _app(source: StatusSource) -> web.Application:
    async def status(_request: web.Request) -> web.Response:
        body = source.status()
        body["process"] = {**await asyncio.to_thread(process_figures), "asyncioTasks": len(asyncio.all_tasks())}
        return web.json_response(body)

    async def settings(_request: web.Request) -> web.Response:
        """What `doctor` shows of a running agent: its settings, not the command's own."""
        return web.json_response({"pid": os.getpid(), "settings": source.settings})

    app = web.Application()
    app.router.add_get("/status", status)
    app.router.add_get("/settings", settings)
    app.router.add_get("/metrics", source.metrics_response)
    return app


# ---- the socket -----------------------------------------------------------------------
def _prepare_socket_path(path: Path) -> None:
    if len(os.fsencode(str(path))) > MAX_SOCKET_PATH:
        raise StatusSocketError(
            f"status socket path {path} is longer than {MAX_SOCKET_PATH} bytes;"
            " set GPUHOST_STATUS_SOCKET to a shorter path"
        )
    parent = path.parent
    if not parent.exists():
        parent.mkdir(parents=True, mode=0o700)
        parent.chmod(0o700)  # mkdir's mode is cut by the umask; make it exact
    elif parent.stat().st_mode & 0o077:
        log.warning(
            "status_socket_dir_open",
            path=str(parent),
            mode=oct(stat.S_IMODE(parent.stat().st_mode)),
            hint="the socket itself is 0600; a directory only root can enter (0700) is safer",
        )
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise StatusSocketError(f"{path} exists and is not a socket; not removing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:
        path.unlink(missing_ok=True)  # stale: left by an agent that died
        log.info("status_socket_stale_removed", path=str(path))
        return
    finally:
        probe.close()
    raise StatusSocketError(f"another gpuhost-agent answers on {path}; is one already running?")


def _check_loopback(listen: tuple[str, int]) -> None:
    host = listen[0]
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise StatusSocketError(f"metrics listen address {host} is not a loopback address (use 127.0.0.1 or ::1)")


class StatusServer:
    def __init__(self, source: StatusSource, socket_path: Path, metrics_listen: tuple[str, int] | None = None):
        self.source = source
        self.socket_path = Path(socket_path)
        self.metrics_listen = metrics_listen
        self._runner: web.AppRunner | None = None
        self._metrics_runner: web.AppRunner | None = None
        self.metrics_port: int | None = None

    async def start(self) -> None:
        _prepare_socket_path(self.socket_path)
        self._runner = web.AppRunner(_app(self.source), access_log=None, handle_signals=False)
        await self._runner.setup()
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others could connect
        try:
            await web.UnixSite(self._runner, str(self.socket_path)).start()
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)
        listen = self.metrics_listen
        if listen is not None and self.source.metrics_enabled:
            _check_loopback(listen)
            metrics_app = web.Application()
            metrics_app.router.add_get("/metrics", self.source.metrics_response)
            self._metrics_runner = web.AppRunner(metrics_app, access_log=None, handle_signals=False)
            await self._metrics_runner.setup()
            site = web.TCPSite(self._metrics_runner, *listen)
            await site.start()
            sockets = getattr(site._server, "sockets", None) or []
            self.metrics_port = sockets[0].getsockname()[1] if sockets else listen[1]
        log.info(
            "status_socket_listening",
            path=str(self.socket_path),
            metrics=self.source.metrics_enabled,
            metrics_listen=f"{listen[0]}:{self.metrics_port}" if listen and self.metrics_port else None,
        )

    async def stop(self) -> None:
        for runner in (self._metrics_runner, self._runner):
            if runner is not None:
                with contextlib.suppress(Exception):
                    await runner.cleanup()
        self._runner = self._metrics_runner = None
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(self.socket_path.lstat().st_mode):
                self.socket_path.unlink()

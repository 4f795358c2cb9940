"""`gpuhost-agent status`: ask the running agent over its status socket.

Readable for people by default, the endpoint's JSON with --json. Exit status:
0 running, 3 not running (no socket, or nobody answers on it), 4 not allowed
to open the socket (it is root's), 1 anything else.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

EXIT_OK, EXIT_ERROR, EXIT_NOT_RUNNING, EXIT_DENIED = 0, 1, 3, 4
# Where the system service's socket is: a non-root user's default state directory is
# elsewhere, so "not running" there may just mean "that one is root's".
SYSTEM_SOCKET = Path("/var/lib/gpuhost-agent/agent.sock")


class StatusUnavailable(Exception):
    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def fetch(socket_path: Path | str, path: str = "/status", timeout: float = 10.0) -> tuple[int, bytes]:
    """GET path over the socket; raises StatusUnavailable with the message and exit code to use."""
    socket_path = str(socket_path)
    connection = _UnixConnection(socket_path, timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        raise StatusUnavailable(
            f"gpuhost-agent is not running (no status socket at {socket_path})", EXIT_NOT_RUNNING
        ) from None
    except PermissionError:
        raise StatusUnavailable(
            f"permission denied on {socket_path}: the status socket is root's; run `sudo gpuhost-agent status`",
            EXIT_DENIED,
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise StatusUnavailable(f"cannot read the agent's status from {socket_path}: {exc}", EXIT_ERROR) from None
    finally:
        connection.close()


def fetch_status(socket_path: Path | str, timeout: float = 10.0) -> dict:
    code, body = fetch(socket_path, "/status", timeout)
    if code != 200:
        raise StatusUnavailable(f"the agent answered {code} on {socket_path}", EXIT_ERROR)
    try:
        return json.loads(body)
    except ValueError:
        raise StatusUnavailable(f"the agent's status on {socket_path} is not JSON", EXIT_ERROR) from None


# ---- rendering ---------------------------------------------------------------------
def _ago(iso: str | None, now: datetime | None = None) -> str:
    if not iso:
        return "never"
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    seconds = max(0, int(((now or datetime.now(timezone.utc)) - moment).total_seconds()))
    if seconds < 120:
        span = f"{seconds}s"
    elif seconds < 7200:
        span = f"{seconds // 60}m"
    elif seconds < 172800:
        span = f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    else:
        span = f"{seconds // 86400}d{seconds % 86400 // 3600}h"
    return f"{iso} ({span} ago)"


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    return [line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)]


def render(status: dict, now: datetime | None = None) -> str:
    init = status.get("initState") or {}
    beat = status.get("heartbeat") or {}
    reports = status.get("reports") or {}
    engine = status.get("engine") or {}
    jobs = status.get("jobs") or {}
    where = status.get("marketplace") or "?"
    if status.get("localMarketplace"):
        where += " (local marketplace)"
    connected = "yes" if status.get("connected") else "NO"
    if status.get("connected") and status.get("connectedSince"):
        connected += f", since {_ago(status['connectedSince'], now)}"
    if status.get("reconnects"):
        connected += f"; {status['reconnects']} reconnect(s)"
    if status.get("conflict"):
        connected += f"; ERROR: {status['conflict']} (stop the other agent)"
    init_line = init.get("state") or "?"
    if init.get("phase"):
        init_line += f" (phase {init['phase']})"
    if init.get("error"):
        init_line += f": {init['error']}"
    beat_line = _ago(beat.get("lastAt"), now)
    if beat.get("failures"):
        beat_line += f", {beat['failures']} failed since"
    engine_line = {True: "up", False: "DOWN", None: "not checked yet"}.get(engine.get("up"), "?")
    if engine.get("outages"):
        engine_line += f", {engine['outages']} outage(s)"
    streams = status.get("streams") or {}
    streams_line = (
        ("open" if streams.get("channelConnected") else "NOT CONNECTED")
        + "; "
        + (
            ", ".join(f"{count} {kind}" for kind, count in sorted((streams.get("open") or {}).items()))
            or "no streams open"
        )
    )
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted((jobs.get("outcomes") or {}).items())) or "none"
    lines = [
        f"gpuhost-agent {status.get('version', '?')}: running (pid {status.get('pid', '?')})"
        f" since {_ago(status.get('since'), now)}",
        f"  marketplace:     {where}",
        f"  environment:     {status.get('envId') or 'unknown yet'}",
        f"  connected:       {connected}",
        f"  start-up:        {init_line}",
        f"  last heartbeat:  {beat_line}",
        f"  Docker Engine:   {engine_line}",
        f"  stream channel:  {streams_line}",
        f"  jobs:            {jobs.get('running', 0)} running; finished: {outcomes}",
        f"  reports:         {reports.get('pending', 0)} pending, {reports.get('sent', 0)} sent,"
        f" {reports.get('rejected', 0)} rejected, {reports.get('dropped', 0)} dropped",
    ]
    error = status.get("lastError")
    if error:
        detail = error.get("error") or ""
        extra = " ".join(f"{k}={error[k]}" for k in ("stack_id", "job_id", "rental_id") if error.get(k))
        lines.append(
            f"  last error:      {error.get('at', '?')} {error.get('level', '')} {error.get('event', '')}"
            + (f": {detail}" if detail else "")
            + (f" [{extra}]" if extra else "")
        )
        if error.get("hint"):
            lines.append(f"                   hint: {error['hint']}")
    else:
        lines.append("  last error:      none")
    stacks = status.get("stacks") or []
    lines.append("")
    if stacks:
        lines.append(f"stacks ({len(stacks)}):")
        rows = [
            [
                s.get("stackId", ""),
                s.get("status", ""),
                s.get("rentalId", ""),
                s.get("updatedAt", ""),
                (s.get("errorMsg") or "")[:80],
            ]
            for s in stacks
        ]
        lines += ["  " + row for row in _table(rows, ["STACK", "STATE", "RENTAL", "UPDATED", "ERROR"])]
    else:
        lines.append("stacks: none")
    return "\n".join(lines) + "\n"


def _system_socket_is_roots(asked: Path, system: Path | None = None) -> bool:
    system = system or SYSTEM_SOCKET
    if os.geteuid() == 0 or asked == system:
        return False
    try:
        system.lstat()
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def run(socket_path: Path | str, as_json: bool = False, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """The `status` command; returns the exit status."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        status = fetch_status(socket_path)
    except StatusUnavailable as exc:
        if exc.exit_code == EXIT_NOT_RUNNING and _system_socket_is_roots(Path(socket_path)):
            exc = StatusUnavailable(
                f"no status socket at {socket_path}, and the system agent's socket"
                f" {SYSTEM_SOCKET} is root's: run `sudo gpuhost-agent status`",
                EXIT_DENIED,
            )
        print(f"gpuhost-agent: {exc}" if exc.exit_code != EXIT_NOT_RUNNING else str(exc), file=err)
        return exc.exit_code
    if as_json:
        out.write(json.dumps(status, indent=2, sort_keys=True) + "\n")
    else:
        out.write(render(status))
    return EXIT_OK

"""The text `gpuhost-agent status` prints: the agent at a glance, then one
block per stack (its name, rental, state and tunnels).

Everything the status holds is made visible first (common/visible.py):
stack names, errors and log fields are the renter's or a container's text,
and none of their control characters reaches the operator's terminal.

Standard library only: the status command runs without the agent's
dependencies being importable by whoever runs it.
"""

from __future__ import annotations

from datetime import datetime, timezone

from gpuhost_agent.common.visible import visible_tree


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


def render(status: dict, now: datetime | None = None) -> str:
    status = visible_tree(status)
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
        *_compliance(status.get("compliance"), now),
        f"  last heartbeat:  {beat_line}",
        f"  Docker Engine:   {engine_line}",
        f"  stream channel:  {streams_line}",
        f"  jobs:            {jobs.get('running', 0)} running{_waiting(jobs)}; finished: {outcomes}",
        f"  reports:         {reports.get('pending', 0)} pending, {reports.get('sent', 0)} sent,"
        f" {reports.get('rejected', 0)} rejected, {reports.get('dropped', 0)} dropped",
    ]
    process = status.get("process")
    if process:
        lines.append(
            f"  process:         {process['rssBytes'] / (1 << 20):.1f} MiB resident, {process['openFiles']} open"
            f" files, {process['threads']} threads, {process['asyncioTasks']} asyncio tasks"
        )
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
        for stack in stacks:
            lines += _stack_block(stack, now)
    else:
        lines.append("stacks: none")
    return "\n".join(lines) + "\n"


INDENT = " " * 19  # under the values of the lines above


def _compliance(verdict: dict | None, now: datetime | None) -> list[str]:
    """The verdict, and each failing check with its reason and fix: what a
    host must change before renters can be given this machine."""
    if not verdict:
        return ["  compliance:      not checked yet"]
    checks = verdict.get("checks") or []
    failed = [check for check in checks if not check.get("ok")]
    if verdict.get("isCompliant"):
        skipped = sum(1 for check in checks if check.get("skipped"))
        counted = f"{len(checks) - skipped} checks pass" + (f", {skipped} skipped" if skipped else "")
        return [f"  compliance:      compliant ({counted}; probed {_ago(verdict.get('probedAt'), now)})"]
    if not failed:  # only the summary came
        return [f"  compliance:      NOT compliant: {verdict.get('failedComplianceReason') or 'no reason given'}"]
    lines = [f"  compliance:      NOT compliant: {', '.join(str(check.get('id', '?')) for check in failed)}"]
    for check in failed:
        lines.append(f"{INDENT}{check.get('id', '?')}: {check.get('summary', '')}")
        if check.get("remedy"):
            lines.append(f"{INDENT}  fix: {check['remedy']}")
    return lines


NAME_CHARS = 128  # protocol/wire_jobs.py MAX_NAME_CHARS; this module imports the standard library only


def _stack_block(stack: dict, now: datetime | None) -> list[str]:
    """`<stackId> "<name>" rental <rentalId> <state>`, its error, its tunnels.
    The name is bounded here too (whatever an older agent's socket sends),
    after it was made visible: a cut can never let a control character through."""
    name = str(stack.get("name") or "")
    name = name if len(name) <= NAME_CHARS else name[:NAME_CHARS] + "..."
    name = f'"{name}"' if name else "(no name)"
    lines = [
        f"  {stack.get('stackId', '?')} {name} rental {stack.get('rentalId') or '?'}"
        f" {stack.get('status') or '?'}, updated {_ago(stack.get('updatedAt'), now)}"
    ]
    if stack.get("errorMsg"):
        lines.append(f"    error: {stack['errorMsg'][:300]}")
    tunnels = stack.get("tunnels")
    if tunnels is None:
        lines.append("    tunnels: not known yet (no container list reported since the agent started)")
    elif not tunnels:
        lines.append("    tunnels: none (no container declares a TCP port)")
    else:
        lines.append("    tunnels:")
        lines += ["      " + line for line in _aligned([_tunnel_row(tunnel, stack) for tunnel in tunnels])]
    return lines


def _tunnel_row(tunnel: dict, stack: dict) -> list[str]:
    if tunnel.get("protocol") == "ssh":
        where, port = "SSH endpoint", "ssh"
    else:
        where = f"{tunnel.get('service') or '?'} ({tunnel.get('container') or tunnel.get('containerId') or '?'})"
        port = f"{tunnel.get('port', '?')}/{tunnel.get('protocol') or 'tcp'}"
    if tunnel.get("open"):
        state = "open"
    elif tunnel.get("containerState") and not str(tunnel["containerState"]).startswith("running"):
        state = f"closed (container {tunnel['containerState']})"
    else:
        state = f"closed (stack {stack.get('status') or '?'})"
    count = tunnel.get("connections") or 0
    connections = f"{count} connection{'' if count == 1 else 's'}"
    if waiting := tunnel.get("loggingIn"):
        connections += f" ({waiting} more logging in)"
    if tunnel.get("logins"):
        connections += f"; logins {', '.join(tunnel['logins'])}"
    return [where, port, state, connections]


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def _waiting(jobs: dict) -> str:
    """ " (3 deploys waiting: at most 4 at once)", or nothing when none waits."""
    waiting = jobs.get("deploysWaiting") or 0
    if not waiting:
        return ""
    return f" ({waiting} deploy{'s' if waiting != 1 else ''} waiting: at most {jobs.get('deployConcurrency')} at once)"

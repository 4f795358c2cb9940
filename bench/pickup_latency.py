"""How fast does the agent pick up a renter's stack, and what does it add to Compose?

Renters feel two delays: the wait before anything happens after they create a
stack (pickup), and the wait until the stack is APPLIED. The agent long-polls,
so pickup should cost a loopback round trip, not a timer period; and the agent
wraps `docker compose up` with `compose config`, a container check and reports,
so its create-to-APPLIED time is compared with a raw `docker compose up -d` of
the same file by the same Compose binary, interleaved so machine noise hits both
(which of the two goes first alternates from pair to pair). The figure of merit
is the ratio of the medians (at most 1.05). A third run of each pair
is the design's floor: Compose's `config` and `up` started together without
the agent, `up` reading config's model on its stdin, as the agent runs them
(docs/design.md, "Two Compose starts, overlapped"): what any agent that
judges Compose's model before `up` costs.

The local marketplace and the agent run in this process exactly as `gpuhost-agent
run` wires them; the renter side goes through real HTTP. All timestamps are the
marketplace store's own (stack createdAt, Job.firstDeliveredAt, and the time each
agent status report was received, from the stack's history), so how often this
script polls does not enter the figures. Each stack is removed and gone before
the raw run and the next stack, so one stack's settle watch and removal do not
overlap the next stack's deploy. The first stack is created only once the agent
has started its first long poll: before that it is still starting up (probing
the machine), which is not pickup; a bench that waited only for the session
once measured that start-up as a pickup tail (p99 61 ms with a p50 of 2.5 ms).

    .venv/bin/python bench/pickup_latency.py [--stacks N] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from gpuhost_agent.common import logs
from gpuhost_agent.core.stacks import naming
from gpuhost_agent.protocol import wire, wire_time
from gpuhost_agent.runtime.compose import find_compose_command
from gpuhost_agent.service.config import AgentConfig
from gpuhost_agent.service.daemon import stop_agent
from gpuhost_agent.service.wiring import build_agent, start_local_marketplace

IMAGE = "gpuhost-test/busybox:1"
# init: true makes `sleep` (PID 1 otherwise) die on SIGTERM, so removal is quick.
COMPOSE = f"""services:
  app:
    image: {IMAGE}
    command: ["sleep", "3600"]
    init: true
"""
PROJECT_LABEL = "com.docker.compose.project"
RATIO_GOAL = 1.05  # create -> APPLIED over raw `up -d`, ratio of medians
PICKUP_GOAL_MS = 50.0


def pct(values: list[float], q: float) -> float:
    """Percentile with linear interpolation between closest ranks."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def ms_between(start: str, end: str | None) -> float | None:
    return None if end is None else (wire_time.parse_iso(end) - wire_time.parse_iso(start)).total_seconds() * 1000


async def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.01)


async def compose_run(compose: list[str], *args: str) -> float:
    """Wall-clock seconds of one Compose call; raises if it fails."""
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *compose, *args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = await proc.communicate()
    elapsed = time.perf_counter() - started
    if proc.returncode:
        raise RuntimeError(f"compose {' '.join(args)} failed: {err.decode(errors='replace')[-500:]}")
    return elapsed


async def raw_up(compose: list[str], project: str, raw_file: Path) -> float:
    """Milliseconds of a raw `up -d` of the bench's file; the project is then
    taken down, so each run creates its network and container as the agent's does."""
    elapsed = await compose_run(compose, "-p", project, "-f", str(raw_file), "up", "-d")
    await compose_run(compose, "-p", project, "down", "-t", "0")
    return 1000 * elapsed


async def raw_config_into_up(compose: list[str], project: str, raw_file: Path) -> float:
    """Milliseconds of the agent's two Compose starts without the agent (the
    design's floor: docs/design.md, "Two Compose starts, overlapped"):
    `config` of the file and `up -d -f -` started together, `up` given
    config's model on its stdin; the project is then taken down."""
    started = time.perf_counter()
    await config_into_up(compose, project, raw_file)
    elapsed = time.perf_counter() - started
    await compose_run(compose, "-p", project, "down", "-t", "0")
    return 1000 * elapsed


async def config_into_up(compose: list[str], project: str, raw_file: Path) -> None:
    """`config` and `up -d -f -` started together, config's model into up's stdin."""
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    config = await asyncio.create_subprocess_exec(
        *compose, "-p", project, "-f", str(raw_file), "config", "--format", "json", stdin=subprocess.DEVNULL, **pipes
    )
    up = await asyncio.create_subprocess_exec(
        *compose, "-p", project, "-f", "-", "up", "-d", stdin=subprocess.PIPE, cwd=raw_file.parent, **pipes
    )
    model, config_err = await config.communicate()
    _, up_err = await up.communicate(model)
    if config.returncode or up.returncode:
        raise RuntimeError(f"config | up failed: {(config_err + up_err).decode(errors='replace')[-500:]}")


def measure_stack(store, stack_id: str) -> dict:
    stack = store.stacks[stack_id]
    job = next(j for j in store.jobs.values() if j.stackId == stack_id and j.type == wire.JOB_DEPLOY)
    # history[0] is the APPLYING set at creation; the agent's own reports follow.
    # The outbox keeps only the latest status per stack, so the agent's APPLYING
    # can be superseded by APPLIED before it is sent; then it is missing here.
    agent = stack["history"][1:]
    reported = next((t for s, t in agent if s == wire.APPLYING), None)
    applied = next((t for s, t in agent if s == wire.APPLIED), None)
    created = stack["createdAt"]
    return {
        "stackId": stack_id,
        "pickup_delivered_ms": ms_between(created, job.firstDeliveredAt),
        "pickup_reported_ms": ms_between(created, reported),
        "create_to_applied_ms": ms_between(created, applied),
    }


def local_config(workdir: Path, *, settle_seconds: float, stop_timeout: int) -> AgentConfig:
    """An agent with the local marketplace on a free loopback port, its state in
    workdir (created here), as `gpuhost-agent run` with no marketplace URL."""
    config = AgentConfig(
        marketplace_url=None,
        env_id=None,
        api_key=None,
        state_dir=workdir / "state",
        local_listen=("127.0.0.1", 0),
        local_api_key=None,
        log_level="warning",
        compose_command=None,
        settle_seconds=settle_seconds,
        stop_timeout=stop_timeout,
    )
    config.state_dir.mkdir(mode=0o700)
    return config


async def bench(n: int, compose: list[str], workdir: Path, projects: set[str]) -> list[dict]:
    config = local_config(workdir, settle_seconds=3.0, stop_timeout=10)
    local = await start_local_marketplace(config)
    store = local.state.store
    projects.add(f"env:{store.envId}")
    parts = build_agent(config, local.base_url, store.envApiKey)
    agent_task = asyncio.create_task(parts.agent.run(), name="agent")
    raw_file = workdir / "raw-compose.yaml"
    raw_file.write_text(COMPOSE)
    results: list[dict] = []
    try:
        await asyncio.wait_for(parts.session.connected.wait(), 30)
        # Ready means polling: jobs are not asked for before start-up is done.
        await wait_until(lambda: local.state.polls_started > 0, 60, "the agent's first job poll")
        async with aiohttp.ClientSession(
            local.base_url + "/", headers={wire.API_KEY_HEADER: store.renterApiKey}
        ) as http:
            async with http.post("rentals", json={"envId": store.envId, "name": "bench", "gpuCount": 0}) as resp:
                resp.raise_for_status()
                rental_id = (await resp.json())["rentalId"]
            for i in range(n):
                raw = f"bench-raw-{i}"
                projects.add(raw)
                raw_ms = floor_ms = None
                if i % 2:  # every other pair, the raw runs first
                    raw_ms = await raw_up(compose, raw, raw_file)
                    floor_ms = await raw_config_into_up(compose, raw, raw_file)
                template = {
                    "name": f"bench-{i}",
                    "description": "pickup bench",
                    "content": COMPOSE,
                    "environmentVariables": {},
                }
                async with http.post(f"rentals/{rental_id}/stacks", json={"template": template}) as resp:
                    resp.raise_for_status()
                    stack_id = await resp.json()
                projects.add(naming.project_name(template["name"], stack_id))
                await wait_until(
                    lambda stack_id=stack_id: store.stacks[stack_id]["status"] in (wire.APPLIED, wire.ERROR),
                    120,
                    f"stack {i} to be applied",
                )
                if store.stacks[stack_id]["status"] == wire.ERROR:
                    raise RuntimeError(f"stack {i} failed: {store.stacks[stack_id]['errorMsg']}")
                row = measure_stack(store, stack_id)
                async with http.delete(f"rentals/{rental_id}/stacks/{stack_id}") as resp:
                    resp.raise_for_status()
                await wait_until(
                    lambda stack_id=stack_id: (
                        stack_id not in store.stacks and all(j.state == "completed" for j in store.jobs.values())
                    ),
                    120,
                    f"stack {i} to be removed",
                )
                row["raw_up_ms"] = raw_ms if raw_ms is not None else await raw_up(compose, raw, raw_file)
                row["raw_config_up_ms"] = (
                    floor_ms if floor_ms is not None else await raw_config_into_up(compose, raw, raw_file)
                )
                results.append(row)
                print(
                    f"  stack {i + 1}/{n}: pickup {row['pickup_delivered_ms']:.1f} ms, "
                    f"applied {row['create_to_applied_ms']:.0f} ms, raw up {row['raw_up_ms']:.0f} ms, "
                    f"raw config into up {row['raw_config_up_ms']:.0f} ms",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        await stop_agent(parts, agent_task)
        await local.stop()
    return results


def cleanup(compose: list[str], projects: set[str]) -> list[str]:
    """Take down whatever of our projects is left (after Ctrl-C or an error);
    "env:ID" entries stand for any project whose containers carry our env id."""

    def listed(*cmd: str, label: str = PROJECT_LABEL) -> set[str]:
        out = subprocess.run(
            ["docker", *cmd, "--filter", f"label={label}", "--format", f'{{{{.Label "{PROJECT_LABEL}"}}}}'],
            capture_output=True,
            text=True,
        ).stdout
        return set(out.split())

    for env in [p[4:] for p in projects if p.startswith("env:")]:
        projects |= listed("ps", "-a", label=f"{wire.LABEL_ENV}={env}")
    left = (listed("ps", "-a") | listed("network", "ls")) & projects
    for project in sorted(left):
        subprocess.run(
            [*compose, "-p", project, "down", "-t", "0", "--volumes", "--remove-orphans"],
            capture_output=True,
            timeout=120,
        )
    return sorted(left)


def summarize(rows: list[dict]) -> dict:
    def stats(key: str) -> dict:
        values = [r[key] for r in rows if r[key] is not None]
        if not values:
            return {"n": 0}
        return {
            "n": len(values),
            "p50": statistics.median(values),
            "p90": pct(values, 0.90),
            "p99": pct(values, 0.99),
            "max": max(values),
            "min": min(values),
        }

    summary = {
        key: stats(key)
        for key in (
            "pickup_delivered_ms",
            "pickup_reported_ms",
            "create_to_applied_ms",
            "raw_up_ms",
            "raw_config_up_ms",
        )
    }
    summary["ratio_of_medians"] = summary["create_to_applied_ms"]["p50"] / summary["raw_up_ms"]["p50"]
    summary["floor_ratio"] = summary["raw_config_up_ms"]["p50"] / summary["raw_up_ms"]["p50"]
    return summary


def machine(compose: list[str]) -> dict:
    def out(*cmd: str) -> str:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()

    return {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "docker_server": out("docker", "version", "--format", "{{.Server.Version}}"),
        "compose": out(*compose, "version", "--short"),
        "compose_command": " ".join(compose),
    }


def report(summary: dict, info: dict, command: str) -> str:
    names = {
        "pickup_delivered_ms": "pickup: created -> job delivered to agent",
        "pickup_reported_ms": "pickup: created -> agent's APPLYING received",
        "create_to_applied_ms": "agent: created -> APPLIED received",
        "raw_up_ms": "raw `compose up -d` (subprocess wall)",
        "raw_config_up_ms": "raw `config` piped into `up -d -f -`",
    }
    lines = [
        f"command: {command}",
        f"machine: nproc={info['nproc']} kernel={info['kernel']} python={info['python']} "
        f"docker server={info['docker_server']} compose={info['compose']} ({info['compose_command']})",
        "",
        f"{'metric (ms)':<46}{'n':>4}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}",
    ]
    for key, label in names.items():
        s = summary[key]
        if not s["n"]:
            lines.append(f"{label:<46}{0:>4}{'(not recorded)':>36}")
            continue
        lines.append(f"{label:<46}{s['n']:>4}{s['p50']:>9.1f}{s['p90']:>9.1f}{s['p99']:>9.1f}{s['max']:>9.1f}")
    pick, ratio = summary["pickup_delivered_ms"]["p50"], summary["ratio_of_medians"]
    pairs = summary["create_to_applied_ms"]["n"]
    lines += [
        "",
        f"pickup p50 (delivered) {pick:.1f} ms  goal < {PICKUP_GOAL_MS:.0f} ms  "
        f"{'MET' if pick < PICKUP_GOAL_MS else 'NOT MET'}",
        f"create->APPLIED / raw up, ratio of medians over {pairs} pairs: {ratio:.3f}  goal <= {RATIO_GOAL}  "
        f"{'MET' if ratio <= RATIO_GOAL else 'NOT MET'}",
        f"the design's floor, raw config into up / raw up: {summary['floor_ratio']:.3f} "
        f"(the agent over it: {summary['create_to_applied_ms']['p50'] / summary['raw_config_up_ms']['p50']:.3f})",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", type=int, default=20, help="number of stacks (and raw runs), default 20")
    parser.add_argument("--json", type=Path, help="also write the raw rows and summary to this file")
    args = parser.parse_args()
    if args.stacks < 1:
        parser.error("--stacks must be at least 1")
    logs.configure("warning")
    command = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    compose = find_compose_command()
    info = machine(compose)
    projects: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="gpuhost-bench-") as tmp:
        try:
            rows = asyncio.run(bench(args.stacks, compose, Path(tmp), projects))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            left = cleanup(compose, projects)
            if left:
                print(f"cleaned up leftover projects: {', '.join(left)}", file=sys.stderr)
    summary = summarize(rows)
    print(report(summary, info, command))
    if args.json:
        args.json.write_text(
            json.dumps({"command": command, "machine": info, "summary": summary, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Many deploys at once: twenty renters create a stack in the same second.

Each round creates N stacks (one per rental, N rentals) through the renter API
at the same moment and times until the last is APPLIED, from the agent's own
reports as the local marketplace received them. The same round is run by a
script: N `docker compose up -d` of the same file, started at once, by the
same Compose binary, timed until the last exits. The two alternate which goes
first, and each round's stacks and projects are gone before the next. A third
script run is the design's floor: the same N, each run as the agent runs it,
Compose's `config` piped into `up -d -f -` (both started together), with no
agent (pickup_latency.config_into_up).

The agent runs as its own process (`gpuhost-agent run` against this process's
local marketplace), with GPUHOST_DEPLOY_CONCURRENCY as given: with
`--concurrency 2,4,8,20` the rounds are run for each value, a new agent
process each, so the table shows what the setting costs or saves.

    .venv/bin/python bench/many_at_once.py [--stacks 20] [--rounds 3] [--concurrency 8] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import agent_runner  # noqa: E402 - bench/ is on the path when run as a script
import aiohttp
from pickup_latency import COMPOSE, cleanup, config_into_up, local_config, wait_until  # noqa: E402

from gpuhost_agent.common import logs
from gpuhost_agent.core.stacks import naming
from gpuhost_agent.protocol import wire, wire_time
from gpuhost_agent.runtime.compose import find_compose_command
from gpuhost_agent.service.config import AgentConfig
from gpuhost_agent.service.wiring import start_local_marketplace

RATIO_GOAL = 1.1  # all APPLIED over all raw `up -d` exited, ratio of medians


async def raw_round(
    compose: list[str], n: int, raw_file: Path, round_no: int, projects: set[str], *, piped: bool = False
) -> float:
    """Seconds until N `up -d` started together have all exited; then all
    down. `piped`: each is the agent's pair without the agent, `config`
    piped into `up -d -f -` (pickup_latency.config_into_up)."""
    names = [f"bench-many-{round_no}-{i}{'-piped' if piped else ''}" for i in range(n)]
    projects.update(names)

    async def up(name: str) -> None:
        if piped:
            return await config_into_up(compose, name, raw_file)
        process = await asyncio.create_subprocess_exec(
            *compose, "-p", name, "-f", str(raw_file), "up", "-d",
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        _, err = await process.communicate()
        if process.returncode:
            raise RuntimeError(f"compose up {name} failed: {err.decode(errors='replace')[-300:]}")

    started = time.perf_counter()
    await asyncio.gather(*(up(name) for name in names))
    elapsed = time.perf_counter() - started
    downs = [
        await asyncio.create_subprocess_exec(
            *compose, "-p", name, "down", "-t", "0", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for name in names
    ]
    await asyncio.gather(*(process.wait() for process in downs))
    return elapsed


class AgentRounds:
    def __init__(self, http: aiohttp.ClientSession, store, n: int, projects: set[str]):
        self.http, self.store, self.n, self.projects = http, store, n, projects

    async def round(self, round_no: int) -> float:
        """Seconds from the moment the N stacks are asked for to the last APPLIED received."""
        rentals = await asyncio.gather(*(self._rental(f"many-{round_no}-{i}") for i in range(self.n)))
        started = time.time()
        stack_ids = await asyncio.gather(
            *(self._stack(rental_id, f"many-{round_no}-{i}") for i, rental_id in enumerate(rentals))
        )
        await wait_until(
            lambda: all(self.store.stacks[s]["status"] in (wire.APPLIED, wire.ERROR) for s in stack_ids),
            300,
            f"round {round_no}'s stacks to be applied",
        )
        failed = [s for s in stack_ids if self.store.stacks[s]["status"] == wire.ERROR]
        if failed:
            raise RuntimeError(f"stack failed: {self.store.stacks[failed[0]]['errorMsg']}")
        last = max(_applied_at(self.store.stacks[s]) for s in stack_ids)
        for rental_id in rentals:  # ending a rental takes its stacks down
            async with self.http.delete(f"rentals/{rental_id}") as resp:
                resp.raise_for_status()
        await wait_until(
            lambda: (
                not any(s in self.store.stacks for s in stack_ids)
                and all(job.state == "completed" for job in self.store.jobs.values())
            ),
            300,
            f"round {round_no}'s stacks to be removed",
        )
        return last - started

    async def _rental(self, name: str) -> str:
        async with self.http.post("rentals", json={"envId": self.store.envId, "name": name, "gpuCount": 0}) as resp:
            resp.raise_for_status()
            return (await resp.json())["rentalId"]

    async def _stack(self, rental_id: str, name: str) -> str:
        template = {"name": name, "description": "many at once", "content": COMPOSE, "environmentVariables": {}}
        async with self.http.post(f"rentals/{rental_id}/stacks", json={"template": template}) as resp:
            resp.raise_for_status()
            stack_id = await resp.json()
        self.projects.add(naming.project_name(name, stack_id))
        return stack_id


def _applied_at(stack: dict) -> float:
    """When the marketplace received the agent's APPLIED (its history's clock)."""
    applied = next(at for status, at in reversed(stack["history"]) if status == wire.APPLIED)
    return wire_time.parse_iso(applied).timestamp()


async def run_setting(
    concurrency: int, n: int, rounds: int, compose: list[str], workdir: Path, projects: set[str]
) -> list[dict]:
    config: AgentConfig = local_config(workdir, settle_seconds=1.0, stop_timeout=1)
    local = await start_local_marketplace(config)
    projects.add(f"env:{local.state.store.envId}")
    agent = agent_runner.SeparateAgent(config, local, workdir, {"GPUHOST_DEPLOY_CONCURRENCY": str(concurrency)})
    raw_file = workdir / "raw-compose.yaml"
    raw_file.write_text(COMPOSE)
    rows: list[dict] = []
    headers = {wire.API_KEY_HEADER: local.state.store.renterApiKey}
    try:
        await agent.start()
        await wait_until(lambda: local.state.polls_started > 0, 60, "the agent's first job poll")
        async with aiohttp.ClientSession(local.base_url + "/", headers=headers) as http:
            rounds_of_agent = AgentRounds(http, local.state.store, n, projects)
            for round_no in range(rounds):
                raw_s = floor_s = None
                if round_no % 2:
                    raw_s = await raw_round(compose, n, raw_file, round_no, projects)
                    floor_s = await raw_round(compose, n, raw_file, round_no, projects, piped=True)
                agent_s = await rounds_of_agent.round(round_no)
                if raw_s is None or floor_s is None:
                    raw_s = await raw_round(compose, n, raw_file, round_no, projects)
                    floor_s = await raw_round(compose, n, raw_file, round_no, projects, piped=True)
                row = {"concurrency": concurrency, "round": round_no, "agent_s": agent_s, "raw_s": raw_s}
                rows.append({**row, "floor_s": floor_s})
                print(
                    f"  concurrency {concurrency}, round {round_no + 1}/{rounds}: all APPLIED {agent_s:.2f} s,"
                    f" raw {raw_s:.2f} s, raw config into up {floor_s:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        await agent.stop()
        await local.stop()
    return rows


def report(rows: list[dict], n: int, command: str) -> str:
    lines = [
        f"command: {command}",
        "",
        f"{'concurrency':>11} {'rounds':>6} {'agent p50 s':>12} {'raw p50 s':>10} {'ratio':>6} {'floor p50 s':>12}"
        f" {'floor/raw':>9} {'agent/floor':>11}",
    ]
    for concurrency in sorted({row["concurrency"] for row in rows}):
        mine = [row for row in rows if row["concurrency"] == concurrency]
        agent, raw, floor = (statistics.median(row[key] for row in mine) for key in ("agent_s", "raw_s", "floor_s"))
        verdict = "MET" if agent / raw <= RATIO_GOAL else "NOT MET"
        lines.append(
            f"{concurrency:>11} {len(mine):>6} {agent:>12.2f} {raw:>10.2f} {agent / raw:>6.2f} {floor:>12.2f}"
            f" {floor / raw:>9.2f} {agent / floor:>11.2f}  {verdict}"
        )
    lines.append(f"\n{n} stacks at once in {n} rentals; goal: ratio of medians <= {RATIO_GOAL}")
    lines.append("floor: the same N run as the agent runs each, `config` piped into `up -d -f -`, without the agent")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--concurrency",
        default=str(AgentConfig.deploy_concurrency),
        help="GPUHOST_DEPLOY_CONCURRENCY values, comma-separated (default: the agent's default)",
    )
    parser.add_argument("--json", help="also write the rounds to this file")
    args = parser.parse_args()
    logs.configure("warning")
    compose = find_compose_command()
    projects: set[str] = set()
    rows: list[dict] = []
    try:
        for concurrency in [int(value) for value in args.concurrency.split(",")]:
            with tempfile.TemporaryDirectory(prefix="gpuhost-many-") as tmp:
                rows += asyncio.run(run_setting(concurrency, args.stacks, args.rounds, compose, Path(tmp), projects))
    finally:
        cleanup(compose, projects)
    print(report(rows, args.stacks, " ".join(["bench/many_at_once.py", *sys.argv[1:]])))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How far behind Docker is the marketplace's container list?

The agent follows the Docker Engine's events for its containers and pushes a
stack's list when it changes (coalesced for 50 ms per stack). This deploys one
stack through the local marketplace (in this process, wired as `gpuhost-agent
run` wires it, talking HTTP on loopback), then kills and starts its container
N times, and measures for each change:

- event -> marketplace: from the engine's own event time (`die` / `start`,
  `timeNano`, read by a separate event follower here) to the moment the
  marketplace store took a list showing the new State (the store's
  apply_containers is wrapped to note the time; nothing is polled);
- call -> marketplace: from the moment the kill/start call returned.

Same machine, same clock. The figures include the coalescing window (50 ms).

    .venv/bin/python bench/event_latency.py [--rounds N] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import docker
from pickup_latency import local_config, pct  # noqa: E402 - bench/ is on the path when run as a script

from gpuhost_agent.common import logs
from gpuhost_agent.protocol import wire
from gpuhost_agent.service.daemon import stop_agent
from gpuhost_agent.service.wiring import build_agent, start_local_marketplace

IMAGE = "gpuhost-test/busybox:1"
COMPOSE = f"services:\n  app:\n    image: {IMAGE}\n    command: ['sleep', '3600']\n    stop_grace_period: 1s\n"


class EventClock:
    """The engine's time of each event of one container, from a follower of our own."""

    def __init__(self, client: docker.DockerClient, container_id: str):
        self.times: dict[str, list[float]] = {}
        self._cond = threading.Condition()
        self._stream = client.api.events(decode=True, filters={"container": container_id, "type": "container"})
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        try:
            for event in self._stream:
                with self._cond:
                    self.times.setdefault(event.get("Action", ""), []).append(event["timeNano"] / 1e9)
                    self._cond.notify_all()
        except Exception:  # noqa: BLE001 - closed at the end
            pass

    def nth(self, action: str, n: int, timeout: float = 10) -> float:
        with self._cond:
            self._cond.wait_for(lambda: len(self.times.get(action, [])) > n, timeout)
            return self.times[action][n]

    def close(self) -> None:
        self._stream.close()


async def wait_for(store_times: list, stack_id: str, predicate, after: float, timeout: float = 10) -> float:
    """When the store took the first list after `after` whose States satisfy `predicate`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for at, target, states in store_times:
            if target == stack_id and at >= after and predicate(states):
                return at
        await asyncio.sleep(0.005)
    raise TimeoutError("the marketplace never showed the change")


async def bench(rounds: int, workdir: Path) -> tuple[list[dict], dict]:
    client = docker.from_env()
    config = local_config(workdir, settle_seconds=1.0, stop_timeout=1)
    local = await start_local_marketplace(config)
    store = local.state.store
    taken: list[tuple[float, str, list[str]]] = []
    apply_containers = store.apply_containers

    def noted(stack_id, containers, observed_at):
        taken.append((time.time(), stack_id, [c["State"] for c in containers]))
        return apply_containers(stack_id, containers, observed_at)

    store.apply_containers = noted
    parts = build_agent(config, local.base_url, store.envApiKey)
    agent_task = asyncio.create_task(parts.agent.run(), name="agent")
    rows: list[dict] = []
    clock = None
    try:
        await asyncio.wait_for(parts.session.connected.wait(), 30)
        async with aiohttp.ClientSession(
            local.base_url + "/", headers={wire.API_KEY_HEADER: store.renterApiKey}
        ) as http:
            async with http.post("rentals", json={"envId": store.envId, "name": "bench", "gpuCount": 0}) as resp:
                rental_id = (await resp.json())["rentalId"]
            template = {"name": "events", "description": "event bench", "content": COMPOSE, "environmentVariables": {}}
            async with http.post(f"rentals/{rental_id}/stacks", json={"template": template}) as resp:
                stack_id = await resp.json()
        deadline = time.monotonic() + 60
        while store.stacks[stack_id]["status"] not in (wire.APPLIED, wire.ERROR) and time.monotonic() < deadline:  # noqa: ASYNC110 - polls the store, which signals nothing
            await asyncio.sleep(0.02)
        assert store.stacks[stack_id]["status"] == wire.APPLIED, store.stacks[stack_id]
        await asyncio.sleep(1.5)  # past the deploy's settle watch: the stack's job is over
        (container,) = client.containers.list(all=True, filters={"label": f"{wire.LABEL_STACK}={stack_id}"})
        clock = EventClock(client, container.id)
        for i in range(rounds):
            for action, call, done in (
                ("die", container.kill, lambda s: s and s[0].startswith("exited")),
                ("start", container.start, lambda s: s == ["running"]),
            ):
                called = time.time()
                await asyncio.to_thread(call)
                returned = time.time()
                seen = await wait_for(taken, stack_id, done, called)
                event_at = await asyncio.to_thread(clock.nth, action, i)
                rows.append(
                    {
                        "change": "kill" if action == "die" else "start",
                        "event_ms": (seen - event_at) * 1000,
                        "call_ms": (seen - returned) * 1000,
                    }
                )
            print(
                f"  round {i + 1}/{rounds}: kill {rows[-2]['event_ms']:.1f} ms, start {rows[-1]['event_ms']:.1f} ms",
                file=sys.stderr,
                flush=True,
            )
        # The status report that clears errorMsg follows the list through the outbox.
        for _ in range(100):
            if not store.stacks[stack_id]["errorMsg"]:
                break
            await asyncio.sleep(0.02)
        watch = parts.agent.container_watch
        counts = {
            "engine_events": watch.events,
            "list_reads": watch.flushes,
            "list_pushes": watch.pushes,
            "status_reports": watch.errors_reported,
            "puts_taken": sum(1 for _at, target, _s in taken if target == stack_id),
            "errorMsg_at_end": store.stacks[stack_id]["errorMsg"],
        }
    finally:
        if clock is not None:
            clock.close()
        await stop_agent(parts, agent_task)
        await local.stop()
        for leftover in client.containers.list(all=True, filters={"label": f"{wire.LABEL_ENV}={store.envId}"}):
            leftover.remove(force=True, v=True)
        client.networks.prune(filters={"label": "com.docker.compose.project"})
        client.close()
    return rows, counts


def report(rows: list[dict], counts: dict, command: str) -> str:
    lines = [
        f"command: {command}",
        "",
        f"{'metric (ms)':<44}{'n':>4}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}{'min':>9}",
    ]
    for change in ("kill", "start"):
        for key, label in (
            ("event_ms", "engine event -> marketplace list"),
            ("call_ms", "call returned -> marketplace list"),
        ):
            values = [r[key] for r in rows if r["change"] == change]
            lines.append(
                f"{change + ': ' + label:<44}{len(values):>4}{statistics.median(values):>9.1f}"
                f"{pct(values, 0.9):>9.1f}{pct(values, 0.99):>9.1f}{max(values):>9.1f}{min(values):>9.1f}"
            )
    lines += ["", "counts: " + ", ".join(f"{key}={value!r}" for key, value in counts.items())]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="kill/start rounds (default 30)")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    logs.configure("warning", json_lines=True)
    with tempfile.TemporaryDirectory(prefix="gpuhost-event-bench-") as tmp:
        rows, counts = asyncio.run(bench(args.rounds, Path(tmp)))
    print(report(rows, counts, shlex.join([sys.executable, *sys.argv])))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "counts": counts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

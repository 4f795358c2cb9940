"""GPU pinning in a Swarm environment under a random sequence of operations:
20 deploys, stack removals and rental ends, drawn with a
printed seed, through the local marketplace and a leader agent process on the
two-node test cluster. After each operation, read from each node's own
engine: no GPU is in the containers of two rentals, every GPU container runs
on the machine of its GPUs, and every container that was running before and
whose stack is still there runs on, with the same id on the same machine
(never moved, never restarted by another rental's deploy)."""

from __future__ import annotations

import asyncio
import json
import os
import random

import pytest
from support.swarm import GPU_STACK, cluster_gpus, docker
from support.waiting import until

from gpuhost_agent.local_marketplace import shapes
from gpuhost_agent.protocol import wire

pytestmark = pytest.mark.swarm
OPERATIONS = 20


def running(machine: int, env_id: str) -> dict[str, dict]:
    """The environment's running containers on one node's engine: id -> (rental, stack, GPUs)."""
    ids = docker(machine, "ps", "-q", "--no-trunc", "--filter", f"label={wire.LABEL_ENV}={env_id}").split()
    found = {}
    for info in json.loads(docker(machine, "inspect", *ids)) if ids else []:
        labels = info["Config"]["Labels"]
        visible = next(
            (e.split("=", 1)[1] for e in info["Config"]["Env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")), ""
        )
        gpus = set() if visible in ("", "void", "none") else set(visible.split(","))
        found[info["Id"]] = {
            "machine": machine,
            "rental": labels[wire.LABEL_RENTAL],
            "stack": labels[wire.LABEL_STACK],
            "gpus": gpus,
        }
    return found


def check(now: dict[str, dict], before: dict[str, dict], live_stacks: set[str], step: str) -> None:
    holder: dict[str, str] = {}
    for container_id, seen in now.items():
        assert seen["gpus"] <= cluster_gpus(seen["machine"]), (step, container_id, seen)
        for uuid in seen["gpus"]:
            assert holder.setdefault(uuid, seen["rental"]) == seen["rental"], (step, uuid, "given to two rentals")
    for container_id, seen in before.items():
        if seen["stack"] in live_stacks:
            assert container_id in now and now[container_id]["machine"] == seen["machine"], (step, "moved", seen)


SPLIT = "its GPUs are on 2 machines and a container runs on one"  # the sandbox's refusal (core/swarm/stack_file.py)


async def test_twenty_random_deploys_removals_and_ends_never_share_a_gpu_or_move_a_task(swarm_leader) -> None:
    (renter, market, agent), _machines = swarm_leader
    seed = int(os.environ.get("GPUHOST_PINNING_SEED") or random.randrange(1 << 30))
    print(f"pinning seed {seed} (GPUHOST_PINNING_SEED={seed} repeats it)")
    draw = random.Random(seed)
    await agent.start()
    await until(lambda: shapes.listing(market.store)["totalGPUs"] == 4, timeout=90)
    rentals: dict[str, list[str]] = {}  # rental -> its live stacks
    before: dict[str, dict] = {}
    done_ops: list[str] = []
    for step in range(OPERATIONS):
        available = shapes.listing(market.store)["availableGPUs"]
        choices = ["deploy"] if available else []
        if rentals:
            choices += ["another stack", "end"]
        if any(rentals.values()):
            choices.append("remove")
        operation = draw.choice(choices or ["wait"])
        label = f"step {step} (seed {seed}): {operation}"
        done_ops.append(operation)
        if operation in ("deploy", "another stack"):
            if operation == "deploy":
                rental_id = await renter.rental(gpu_count=draw.randint(1, min(2, available)))
                rentals[rental_id] = []
            else:
                rental_id = draw.choice(sorted(rentals))
            stack_id = await renter.stack(rental_id, GPU_STACK)
            done = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=120)
            if done and SPLIT in (done.get("errorMsg") or ""):
                continue  # free GPUs one on each machine: a 2-GPU rental spans both, and GPU_STACK is one service
            assert done and done["status"] == wire.APPLIED, (label, done and done.get("errorMsg"))
            rentals[rental_id].append(stack_id)
        elif operation == "remove":
            rental_id = draw.choice(sorted(r for r, stacks in rentals.items() if stacks))
            stack_id = rentals[rental_id].pop(draw.randrange(len(rentals[rental_id])))
            status, _ = await renter.call("DELETE", f"/rentals/{rental_id}/stacks/{stack_id}")
            assert status in (200, 202, 204), label
            await renter.wait_stack(rental_id, stack_id, (), timeout=90)
        elif operation == "end":
            rental_id = draw.choice(sorted(rentals))
            del rentals[rental_id]
            status, _ = await renter.call("DELETE", f"/rentals/{rental_id}")
            assert status == 200, label
        else:
            await asyncio.sleep(1)  # every GPU rented and no rental: only while a rental's end frees them
        live = {stack_id for stacks in rentals.values() for stack_id in stacks}
        env_id = market.store.envId
        now = {**await asyncio.to_thread(running, 1, env_id), **await asyncio.to_thread(running, 2, env_id)}
        check(now, before, live, label)
        before = now
    print("operations:", ", ".join(done_ops))

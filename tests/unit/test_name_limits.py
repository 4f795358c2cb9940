"""Names are bounded: the local marketplace refuses a
rental or stack name above 128 characters with 400 (curl, as a renter
sends it), and the agent, which takes any name a marketplace sends, shows at
most 128 characters of it in `gpuhost-agent status`. Before: a 10 KB name was
taken and filled the operator's screen."""

from __future__ import annotations

import asyncio
import json

from support.stacks import TEMPLATE

from gpuhost_agent.protocol import wire, wire_jobs
from gpuhost_agent.service.status import render as status_render
from gpuhost_agent.service.status.stacks import stack_entries

HUGE = "n" * 10_000


async def _curl(market, method: str, path: str, body: dict) -> tuple[int, dict]:
    process = await asyncio.create_subprocess_exec(
        "curl", "-s", "-X", method, "-H", f"{wire.API_KEY_HEADER}: {market.store.renterApiKey}",
        "-H", "Content-Type: application/json", "--data-binary", "@-", "-w", "\n%{http_code}",
        market.base_url + path, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await process.communicate(json.dumps(body).encode())
    text, _, code = out.decode().rpartition("\n")
    return int(code), json.loads(text)


async def test_the_marketplace_refuses_names_above_the_limit(market) -> None:
    env = market.store.envId
    status, body = await _curl(market, "POST", "/rentals", {"envId": env, "name": HUGE})
    assert status == 400 and "10000 characters long, more than the 128" in body["message"]
    status, rental = await _curl(market, "POST", "/rentals", {"envId": env, "name": "r" * 128})
    assert status == 201 and rental["name"] == "r" * 128
    rental_id = rental["rentalId"]
    status, body = await _curl(market, "PATCH", f"/rentals/{rental_id}", {"name": HUGE})
    assert status == 400 and "128" in body["message"]
    status, body = await _curl(market, "POST", f"/rentals/{rental_id}/stacks", {"template": {**TEMPLATE, "name": HUGE}})
    assert status == 400 and "template.name is 10000 characters long" in body["message"]
    status, _ = await _curl(
        market, "POST", f"/rentals/{rental_id}/stacks", {"template": {**TEMPLATE, "name": "s" * 128}}
    )
    assert status == 201


def test_the_agent_takes_a_huge_stack_name_and_shows_it_bounded() -> None:
    job = wire_jobs.StackJob.from_wire(
        {"jobId": "j", "type": wire.JOB_REMOVE, "stackId": "s1", "rentalId": "r1", "envId": "e", "stackName": HUGE}
    )
    assert job.stack_name == HUGE  # the project is a slug of it: the same whichever way the name came
    (entry,) = stack_entries(
        {"s1": {"status": wire.APPLIED, "rental_id": "r1"}}, {"s1": job.stack_name}, lambda _: [], []
    )
    assert entry["name"] == "n" * 128 + "..."
    text = status_render.render({"stacks": [{**entry, "name": "\x1b" * 10_000}]})
    (line,) = [line for line in text.splitlines() if line.startswith("  s1 ")]
    assert len(line) < 250 and "\x1b" not in line

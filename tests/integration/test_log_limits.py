"""Every container's log is capped: a container printing fast leaves
at most the host's size x files on disk, and a renter following its log
through the marketplace gets every line once, in order, across Docker's
rotations. On the real engine, with a small cap so that it rotates often."""

from __future__ import annotations

import asyncio
import os

import aiohttp
from support.renter_streams import STDOUT, Demux, logs_path
from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import wire

MAX_SIZE, MAX_FILES = 64 * 1024, 2
BATCHES, PER_BATCH = 300, 500  # 150 000 numbered lines in about 9 s: Docker rotates about every 900 lines
BATCH = f"seq $$((i*{PER_BATCH}+1)) $$((i*{PER_BATCH}+{PER_BATCH}))"
PRINTER = f"""
services:
  printer:
    image: {TEST_IMAGE}
    command:
      - sh
      - -c
      - "sleep 2; i=0; while [ $$i -lt {BATCHES} ]; do {BATCH}; usleep 30000; i=$$((i+1)); done; echo done; sleep 3600"
"""
LAST = BATCHES * PER_BATCH


async def _follow(http: aiohttp.ClientSession, url: str, key: str, demux: Demux) -> None:
    params = {"follow": "true", "tail": "all"}
    async with http.get(url, params=params, headers={wire.API_KEY_HEADER: key}) as response:
        assert response.status == 200
        async for chunk in response.content.iter_any():
            demux.feed(chunk)
            if "done\n" in demux.text(STDOUT)[-10:]:
                return


async def test_a_fast_printer_keeps_its_log_under_the_cap_and_the_follower_loses_nothing(gpu_agent, docker_client):
    renter, _parts, _local, _ = await gpu_agent(gpus=1, log_max_size="64k", log_max_files=MAX_FILES)
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, PRINTER)
    await renter.wait_stack(rental_id, stack_id, (wire.APPLIED,), timeout=30)
    await until(lambda: renter.containers(rental_id, stack_id), timeout=10)  # the list follows APPLIED
    (container,) = await renter.containers(rental_id, stack_id)
    attrs = await asyncio.to_thread(docker_client.api.inspect_container, container["Id"])
    assert attrs["HostConfig"]["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "64k", "max-file": "2"}}

    demux = Demux()
    url = renter.base_url + logs_path(rental_id, stack_id, container["Id"])
    await asyncio.wait_for(_follow(renter.http, url, renter.store.renterApiKey, demux), timeout=60)
    numbers = [int(line) for line in demux.lines(STDOUT) if line.isdigit()]
    assert numbers == list(range(1, LAST + 1)), _first_gap(numbers)

    log_path = attrs["LogPath"]
    written = await asyncio.to_thread(_log_files_size, log_path)
    assert written <= MAX_SIZE * MAX_FILES + 4096, f"{written} bytes of log on disk, cap {MAX_SIZE * MAX_FILES}"
    await until(lambda: asyncio.to_thread(os.path.exists, log_path + ".1"))  # it did rotate


def _log_files_size(log_path: str) -> int:
    folder, name = os.path.split(log_path)
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.startswith(name))


def _first_gap(numbers: list[int]) -> str:
    for expected, got in enumerate(numbers, start=1):
        if got != expected:
            return f"line {expected} is {got} ({len(numbers)} lines)"
    return f"{len(numbers)} lines, {LAST} printed"

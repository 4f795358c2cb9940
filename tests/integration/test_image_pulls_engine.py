"""Big images, on the real engine and Compose: the agent
pulls a stack's missing images itself, so the renter reads the pull's
progress while the stack is APPLYING; two stacks needing one image share one
pull; a pull that stalls fails the stack naming the image and its registry,
leaving nothing that blocks a retry; an image is kept when its stack goes,
so the next deploy of it starts without a pull, and the images the agent
pulled are evicted least recently used when the disk floor needs room, never
one a container uses.

The image (tests/support/big_image.py) is the test busybox plus a GiB of
zeros (a few MB compressed) and 48 MiB of random bytes; it is fetched
through a relay to the test registry (tests/support/throttle_relay.py) that
passes 12 MB/s and can stall, and counts what it passed.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import docker.errors
import pytest
from support import big_image
from support.agent_config import make_config
from support.engine import remove_env_resources
from support.renter import Renter
from support.stacks import TEST_IMAGE
from support.throttle_relay import ThrottleRelay
from support.waiting import until

from gpuhost_agent.protocol import wire
from gpuhost_agent.service.daemon import stop_agent
from gpuhost_agent.service.wiring import build_agent, start_local_marketplace

RATE = 12_000_000  # bytes a second: the 55 MB to fetch take about 5 s


def forget_big_image(client) -> None:
    """Every local tag of the big image (relays of earlier runs had other ports): its layers go with them."""
    for image in client.images.list():
        for tag in image.tags:
            if tag.endswith((f"/{big_image.NAME}:{big_image.TAG}", f"/{big_image.SMALL}:{big_image.TAG}")):
                with contextlib.suppress(docker.errors.APIError):
                    client.images.remove(tag, force=True)


@pytest.fixture
async def relayed(tmp_path, docker_client):
    """start(**config overrides) -> (renter, parts, relay, image reference through the relay)."""
    await asyncio.to_thread(big_image.ensure)
    await asyncio.to_thread(big_image.ensure, big_image.SMALL)
    await asyncio.to_thread(forget_big_image, docker_client)
    running = []
    async with ThrottleRelay(bytes_per_second=RATE) as relay:

        async def start(**overrides):
            config = make_config(tmp_path / "state", allowed_registries=("127.0.0.1:5000", relay.address), **overrides)
            local = await start_local_marketplace(config)
            parts = build_agent(config, local.base_url, local.state.store.envApiKey)
            task = asyncio.create_task(parts.agent.run())
            await asyncio.wait_for(parts.session.connected.wait(), 10)
            http = aiohttp.ClientSession()
            running.append((parts, task, local, http))
            return Renter(http, local.base_url, local.state.store), parts, relay, f"{relay.address}/{big_image.NAME}:1"

        try:
            yield start
        finally:
            for parts, task, local, http in running:
                await http.close()
                await stop_agent(parts, task)
                await local.stop()
                await asyncio.to_thread(remove_env_resources, docker_client, local.state.store.envId)
            await asyncio.to_thread(forget_big_image, docker_client)


def sleeper(image: str) -> str:
    return f"services:\n  model:\n    image: {image}\n    command: ['sleep', '3600']\n"


async def test_progress_one_pull_for_two_stacks_a_kept_image_and_eviction(relayed, docker_client):
    renter, parts, relay, image = await relayed()
    first, second = await renter.rental(), await renter.rental()
    one = await renter.stack(first, sleeper(image))
    two = await renter.stack(second, sleeper(image))

    # The renter reads the pull's progress while the stack is APPLYING.
    seen: set[str] = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while loop.time() < deadline:
        stacks = {s["stackId"]: s for s in [*await renter.stacks(first), *await renter.stacks(second)]}
        if all(stacks[s]["status"] != wire.APPLYING for s in (one, two)):
            break
        seen |= {s["errorMsg"] for s in stacks.values() if s["status"] == wire.APPLYING and "MB," in s["errorMsg"]}
        await asyncio.sleep(0.2)
    assert {s["status"] for s in stacks.values()} == {wire.APPLIED}, stacks
    moving = [text for text in seen if f"pulling image '{image}': " in text and " of 4 layers" in text]
    assert len({text.split(": ", 1)[1].split(" of ")[0] for text in moving}) >= 2, seen  # bytes that grew
    # One pull for both: the relay passed the image's compressed layers once (55 MB), not twice.
    assert parts.deployer.images.started == 1
    assert 50_000_000 < relay.bytes_down < 80_000_000, relay.bytes_down

    # Removing both stacks keeps the image; the next deploy of it starts without a pull.
    for rental_id, stack_id in ((first, one), (second, two)):
        status, _ = await renter.call("DELETE", f"/rentals/{rental_id}/stacks/{stack_id}")
        assert status in (200, 202)
        assert await renter.wait_stack(rental_id, stack_id, (), timeout=30) is None
    assert await asyncio.to_thread(docker_client.images.get, image)
    fetched, connections = relay.bytes_down, relay.connections
    started = loop.time()
    again = await renter.stack(first, sleeper(image))
    assert (await renter.wait_stack(first, again, (wire.APPLIED, wire.ERROR)))["status"] == wire.APPLIED
    assert loop.time() - started < 10
    assert (relay.bytes_down, relay.connections, parts.deployer.images.started) == (fetched, connections, 1)

    # Eviction: a small image the agent pulled, its stack gone, goes when the floor needs room; the big
    # one, which a running stack uses, stays; the host's own (the test busybox) is never recorded.
    small = f"{relay.address}/{big_image.SMALL}:1"
    brief = await renter.stack(second, sleeper(small))
    assert (await renter.wait_stack(second, brief, (wire.APPLIED, wire.ERROR)))["status"] == wire.APPLIED
    status, _ = await renter.call("DELETE", f"/rentals/{second}/stacks/{brief}")
    assert await renter.wait_stack(second, brief, (), timeout=30) is None
    cache = parts.deployer.images.cache
    assert set(await cache.recorded()) == {image, small}
    room = cache.room.__self__  # the DiskRoom: its floor raised above the disk's free space (the sandbox's stays 0)
    free, _floor = await cache.room()
    room.floor_bytes = free + 10 * 1000**3
    trigger = await renter.stack(second, sleeper(TEST_IMAGE))
    assert (await renter.wait_stack(second, trigger, (wire.APPLIED, wire.ERROR)))["status"] == wire.APPLIED
    with pytest.raises(docker.errors.ImageNotFound):
        await asyncio.to_thread(docker_client.images.get, small)
    assert await asyncio.to_thread(docker_client.images.get, image)
    assert await asyncio.to_thread(docker_client.images.get, TEST_IMAGE)
    assert set(await cache.recorded()) == {image}


async def test_a_stalled_pull_fails_the_stack_naming_image_and_registry(relayed, docker_client):
    renter, parts, relay, image = await relayed(pull_stall_seconds=2.0)
    relay.stall()  # the registry accepts connections and sends nothing
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, sleeper(image))
    stack = await renter.wait_stack(rental_id, stack_id, (wire.ERROR, wire.APPLIED), timeout=30)
    assert stack["status"] == wire.ERROR, stack
    assert f"pulling image '{image}' from registry '{relay.address}' stalled" in stack["errorMsg"], stack
    assert "GPUHOST_PULL_STALL_SECONDS" in stack["errorMsg"]
    assert await renter.containers(rental_id, stack_id) == []
    with pytest.raises(docker.errors.ImageNotFound):
        await asyncio.to_thread(docker_client.images.get, image)


async def test_an_image_larger_than_the_rentals_disk_share_is_refused_before_its_pull(relayed, docker_client):
    renter, parts, relay, image = await relayed(rental_disk_bytes=20_000_000)
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, sleeper(image))
    stack = await renter.wait_stack(rental_id, stack_id, (wire.ERROR, wire.APPLIED), timeout=30)
    assert stack["status"] == wire.ERROR, stack
    message = stack["errorMsg"]
    assert f"'{image}' (0.06 GB)" in message and "more than this rental's disk share of 0.02 GB" in message, message
    assert relay.bytes_down < 100_000 and parts.deployer.images.started == 0  # the manifest only
    with pytest.raises(docker.errors.ImageNotFound):
        await asyncio.to_thread(docker_client.images.get, image)


async def test_a_pull_no_deploy_waits_on_stops_and_a_slow_one_meets_its_deadline(relayed, docker_client):
    """Pull slots on the real engine: when the only deploy waiting on a pull is cancelled, the
    engine's pull stops (the registry passes nothing more); a pull past GPUHOST_PULL_MAX_SECONDS fails
    the stack naming the image and its registry."""
    renter, parts, relay, image = await relayed()
    pulls = parts.deployer.images
    loop = asyncio.get_running_loop()
    deploy = asyncio.create_task(pulls.fetch([image], lambda _text: None, "r1"))  # a deploy's own wait
    deadline = loop.time() + 30
    while relay.bytes_down < 5_000_000:  # the pull is under way
        assert loop.time() < deadline, relay.bytes_down
        await asyncio.sleep(0.05)
    deploy.cancel()
    await asyncio.gather(deploy, return_exceptions=True)
    await asyncio.sleep(1.0)  # the engine's pull is closed at the agent's next event
    passed = relay.bytes_down
    await asyncio.sleep(1.5)
    assert relay.bytes_down == passed < 50_000_000, (passed, relay.bytes_down)  # stopped, not finished
    assert not pulls._running  # noqa: SLF001
    with pytest.raises(docker.errors.ImageNotFound):
        await asyncio.to_thread(docker_client.images.get, image)

    pulls.max_seconds = 2.0  # as GPUHOST_PULL_MAX_SECONDS=2 would (the cancel above ran without it)
    rental_id = await renter.rental()
    slow = await renter.stack(rental_id, sleeper(image))  # 55 MB at 12 MB/s: past the 2 s deadline
    stack = await renter.wait_stack(rental_id, slow, (wire.ERROR, wire.APPLIED), timeout=30)
    assert stack["status"] == wire.ERROR, stack
    assert f"pulling image '{image}' from registry '{relay.address}' took longer than 2 s" in stack["errorMsg"]
    assert "GPUHOST_PULL_MAX_SECONDS" in stack["errorMsg"]


async def test_a_stack_removed_while_its_image_pulls_goes_at_once_and_its_pull_stops(relayed, docker_client):
    """The renter deletes a stack whose pull is under way and slowed to 0.5 MB/s (the 55 MB would take
    about 100 s): the removal does not wait for the pull, the engine's pull stops (the registry passes
    nothing more), nothing of the stack is left, and the marketplace hears why the deploy stopped
    (core/stacks/deploy_cancels.py)."""
    renter, parts, relay, image = await relayed()
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, sleeper(image))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while relay.bytes_down < 5_000_000:  # the pull is under way
        assert loop.time() < deadline, relay.bytes_down
        await asyncio.sleep(0.05)
    relay.rate = 500_000
    status, _ = await renter.call("DELETE", f"/rentals/{rental_id}/stacks/{stack_id}")
    assert status in (200, 202)
    started = loop.time()
    assert await renter.wait_stack(rental_id, stack_id, (), timeout=30) is None
    assert loop.time() - started < 10
    jobs = {job.type: job for job in renter.store.jobs.values() if job.stackId == stack_id}
    deploy = jobs[wire.JOB_DEPLOY]  # the marketplace's record of the deploy's answer
    assert (deploy.outcome, deploy.errorMsg) == (
        wire.OUTCOME_FAILED,
        "deploy stopped: the stack's removal came before the deploy finished",
    )
    await until(lambda: not parts.deployer.images._running, timeout=20)  # noqa: SLF001 - closed at its next event
    await asyncio.sleep(1.0)  # dockerd stops its download a moment after its client went
    passed = relay.bytes_down
    await asyncio.sleep(1.5)
    assert relay.bytes_down == passed < 50_000_000, (passed, relay.bytes_down)  # stopped, not finished
    left = await asyncio.to_thread(
        docker_client.containers.list, all=True, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}
    )
    assert left == []
    with pytest.raises(docker.errors.ImageNotFound):
        await asyncio.to_thread(docker_client.images.get, image)

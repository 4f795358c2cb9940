"""An image is untrusted, on the real engine.

A local image built FROM the test image carries the agent's own labels
(`io.gpuhost.ssh=true`, the rental's GPUs) and the NVIDIA toolkit's device
variables in its ENV. A container of it, deployed by a template that did not
ask for SSH, on a rental without GPUs: SSH is refused, its labels and toolkit
variables are the agent's, its cgroup namespace is its own; and a ledger
rebuilt from the engine after the state database is lost never gives the
image's claimed GPU to that rental, even from a container labelled the way the
agent labelled them before this change (no GPU label at all).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from support.agent_process import Market, start_in_process
from support.engine import remove_env_resources
from support.hand_made_image import load_with_config
from support.renter import Renter
from support.sandbox_corpus import assert_container_sandboxed
from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.core.sandbox.harden import GPU_LABEL
from gpuhost_agent.core.stack_errors import StackFailed
from gpuhost_agent.core.stacks.compose_backend import ComposeBackend
from gpuhost_agent.core.stacks.deployer import AGENT_FILE
from gpuhost_agent.local_marketplace.channel_hub import StreamRefused
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.compose import ComposeRunner, find_compose_command
from gpuhost_agent.runtime.engine.client import DockerEngine
from gpuhost_agent.service.daemon import stop_agent
from gpuhost_agent.storage.agent_db import DB_FILE

HOSTILE_IMAGE = "gpuhost-test/hostile-labels:1"


def _claimed_gpu() -> str:
    from support.fake_nvml import h100_sxm

    return h100_sxm(2)[0].uuid


def _build(docker_client, tmp_path: Path) -> None:
    gpu = _claimed_gpu()
    (tmp_path / "Dockerfile").write_text(
        f"FROM {TEST_IMAGE}\n"
        f"LABEL {wire.LABEL_SSH}=true {wire.LABEL_GPUS}={gpu} {GPU_LABEL}={gpu} {wire.LABEL_EXPOSED_PORTS}=22\n"
        "ENV NVIDIA_DRIVER_CAPABILITIES=all NVIDIA_MOFED=enabled NVIDIA_GDS=enabled NVIDIA_NVSWITCH=enabled "
        "NVIDIA_GDRCOPY=enabled NVIDIA_IMEX_CHANNELS=all NVIDIA_MIG_CONFIG_DEVICES=all "
        "NVIDIA_MIG_MONITOR_DEVICES=all\n"
    )
    docker_client.images.build(path=str(tmp_path), tag=HOSTILE_IMAGE, rm=True)


STACK = f"services:\n  app:\n    image: {HOSTILE_IMAGE}\n    command: ['sleep', '3600']\n    stop_grace_period: 1s\n"


@pytest.fixture
def hostile_image(docker_client, tmp_path_factory):
    _build(docker_client, tmp_path_factory.mktemp("hostile-image"))
    return HOSTILE_IMAGE


async def _deploy(renter: Renter, rental_id: str) -> str:
    stack_id = await renter.stack(rental_id, STACK, name="hostile-image")
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    return stack_id


def _containers(docker_client, stack_id: str) -> list:
    return docker_client.containers.list(all=True, filters={"label": f"{wire.LABEL_STACK}={stack_id}"})


async def test_an_images_labels_and_toolkit_variables_do_not_reach_the_host(
    hostile_image, local_market, docker_client
) -> None:
    renter, _parts, local = local_market
    rental_id = await renter.rental()
    stack_id = await _deploy(renter, rental_id)  # the template does not ask for SSH
    (container,) = await asyncio.to_thread(_containers, docker_client, stack_id)
    labels = container.attrs["Config"]["Labels"]
    assert (labels[wire.LABEL_SSH], labels[wire.LABEL_GPUS], labels[GPU_LABEL]) == ("", "", "")
    assert labels[wire.LABEL_EXPOSED_PORTS] == ""  # no port 22 declared for a tunnel by the image
    env = dict(item.partition("=")[::2] for item in container.attrs["Config"]["Env"])
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility" and env["NVIDIA_MOFED"] == "disabled"
    assert env["NVIDIA_IMEX_CHANNELS"] == "" and env["NVIDIA_MIG_CONFIG_DEVICES"] == ""
    assert container.attrs["HostConfig"]["CgroupnsMode"] == "private"
    assert_container_sandboxed(container.attrs, allowed_gpus=0)
    try:
        await local.state.streams.open("ssh", rental_id, {"stackId": stack_id})
        raise AssertionError("the agent opened SSH on a stack whose template did not ask for it")
    except StreamRefused as refused:
        assert refused.status == 404, refused.message


@pytest.fixture
async def world(tmp_path, monkeypatch, docker_client):
    """(renter, market, start, stop): agents on the same state directory, on a stand-in machine of 2 GPUs."""
    from support.fake_nvml import build_lib, forget_loaded_nvml, h100_sxm, write_config

    monkeypatch.setenv("FAKE_NVML_CONFIG", str(await asyncio.to_thread(write_config, tmp_path / "n.conf", h100_sxm(2))))
    market = Market(tmp_path / "market.json")
    await market.start()
    running = []

    async def start():
        nvml = str(await asyncio.to_thread(build_lib))
        parts, task = await start_in_process(
            market, tmp_path / "state", nvml_library=nvml, gpu_check_image=TEST_IMAGE, reconcile_grace_seconds=60
        )
        running.append((parts, task))
        return parts

    async def stop():
        await stop_agent(*running.pop())

    import aiohttp

    http = aiohttp.ClientSession()
    try:
        yield Renter(http, market.base_url, market.store), market, start, stop
    finally:
        await http.close()
        while running:
            await stop()
        await market.stop()
        await asyncio.to_thread(remove_env_resources, docker_client, market.store.envId)
        await asyncio.to_thread(forget_loaded_nvml)


def _as_before_this_change(docker_client, env_id: str) -> str:
    """A container labelled as the agent once labelled them: no
    rental-GPU label where the rental had none, so the image's shows through."""
    rental_id = f"old-{uuid.uuid4().hex[:8]}"
    labels = {
        wire.LABEL_MANAGED: "true",
        wire.LABEL_STACK: f"stack-{rental_id}",
        wire.LABEL_RENTAL: rental_id,
        wire.LABEL_ENV: env_id,
        GPU_LABEL: "",
    }
    docker_client.containers.create(HOSTILE_IMAGE, ["sleep", "3600"], labels=labels)
    return rental_id


async def test_a_rebuilt_ledger_never_gives_an_images_claimed_gpu(hostile_image, world, docker_client, tmp_path):
    renter, market, start, stop = world
    await start()
    rental_id = await renter.rental(gpu_count=0)
    await _deploy(renter, rental_id)
    await stop()
    for suffix in ("", "-wal", "-shm"):
        await asyncio.to_thread(Path(f"{tmp_path / 'state' / DB_FILE}{suffix}").unlink, missing_ok=True)
    old_rental = await asyncio.to_thread(_as_before_this_change, docker_client, market.store.envId)
    (old,) = await asyncio.to_thread(
        docker_client.containers.list, all=True, filters={"label": f"{wire.LABEL_RENTAL}={old_rental}"}
    )
    assert old.labels[wire.LABEL_GPUS] == _claimed_gpu()  # the image's claim, on the engine's record

    parts = await start()
    await until(lambda: parts.reconciler.runs >= 1, timeout=20)
    assert parts.reconciler.ledger.assignments == {}, parts.reconciler.ledger.assignments
    # Both GPUs are free: a rental of two gets them.
    full = await renter.rental(gpu_count=2)
    stack = await renter.wait_stack(full, await renter.stack(full, STACK), (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED and len(stack["assignedGPUs"]) == 2, stack


HEAVY_IMAGE = "gpuhost-test/heavy-labels:1"


async def test_an_image_or_file_with_too_many_bytes_of_labels_fails_and_leaves_nothing(
    local_market, docker_client, tmp_path
) -> None:
    """Every event and container list carries a container's labels, for every renter
    (core/sandbox/label_size.py): 96 KiB of them from the image fail the stack right
    after it started, with nothing left; the same in the file is refused before."""
    renter, _parts, _local = local_market
    dockerfile = f"FROM {TEST_IMAGE}\n" + "".join(f"LABEL renter.notes.{i}={'n' * 32_000}\n" for i in range(3))
    await asyncio.to_thread((tmp_path / "Dockerfile").write_text, dockerfile)
    await asyncio.to_thread(docker_client.images.build, path=str(tmp_path), tag=HEAVY_IMAGE, rm=True)
    try:
        rental_id = await renter.rental()
        heavy = STACK.replace(HOSTILE_IMAGE, HEAVY_IMAGE)
        stack_id = await renter.stack(rental_id, heavy, name="heavy-image")
        stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
        assert stack["status"] == wire.ERROR, stack
        assert "app-1 carries 96," in stack["errorMsg"] and "use an image with fewer labels" in stack["errorMsg"], stack
        assert await asyncio.to_thread(_containers, docker_client, stack_id) == []

        in_file = STACK.replace(HOSTILE_IMAGE, TEST_IMAGE) + f"    labels:\n      notes: {'n' * 70_000}\n"
        stack_id = await renter.stack(rental_id, in_file, name="heavy-file")
        stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
        assert stack["status"] == wire.ERROR and "at most 65,536 bytes (64 KiB) a service" in stack["errorMsg"], stack
        assert await asyncio.to_thread(_containers, docker_client, stack_id) == []
    finally:
        await asyncio.to_thread(docker_client.images.remove, HEAVY_IMAGE, force=True)


PROBING_IMAGE = "gpuhost-test/probing:1"
HAND_MADE = "gpuhost-test/hand-made:1"
REGISTRY_MADE = "127.0.0.1:5000/gpuhost-test/hand-made:1"


async def _outcome(renter: Renter, rental_id: str, text: str, name: str) -> dict:
    stack_id = await renter.stack(rental_id, text, name=name)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=90)
    return {**stack, "stackId": stack_id}


async def test_an_images_healthcheck_that_probes_every_millisecond_is_refused_before_its_start(
    local_market, docker_client, tmp_path
) -> None:
    """Each probe is an exec the host's engine runs, outside the rental's share
    (core/sandbox/healthcheck.py). The engine merges an image's HEALTHCHECK into
    the container field by field, so the pulled image is judged before `up`
    with the file's healthcheck over it: an image probing every 1 ms is refused
    with no container, even under a file that sets only the test, and deploys
    with the interval set in the file."""
    renter, _parts, _local = local_market
    dockerfile = f"FROM {TEST_IMAGE}\nHEALTHCHECK --interval=1ms --timeout=1s CMD true\n"
    await asyncio.to_thread((tmp_path / "Dockerfile").write_text, dockerfile)
    await asyncio.to_thread(docker_client.images.build, path=str(tmp_path), tag=PROBING_IMAGE, rm=True)
    try:
        rental_id = await renter.rental()
        probing = STACK.replace(HOSTILE_IMAGE, PROBING_IMAGE)
        for name, text in (
            ("image", probing),
            ("test-only", probing + "    healthcheck:\n      test: ['CMD', 'true']\n"),
            ("zero", probing + "    healthcheck:\n      interval: 0s\n"),
        ):
            stack = await _outcome(renter, rental_id, text, name)
            assert stack["status"] == wire.ERROR, stack
            assert 'service "app" probes its health every 1 ms' in stack["errorMsg"], stack
            assert await asyncio.to_thread(_containers, docker_client, stack["stackId"]) == []

        stack = await _outcome(renter, rental_id, probing + "    healthcheck:\n      interval: 2s\n", "bounded")
        assert stack["status"] == wire.APPLIED, stack
        (container,) = await asyncio.to_thread(_containers, docker_client, stack["stackId"])
        assert container.attrs["Config"]["Healthcheck"]["Interval"] == 2_000_000_000
    finally:
        await asyncio.to_thread(docker_client.images.remove, PROBING_IMAGE, force=True)


def _negative_interval(config: dict) -> None:
    config["Healthcheck"] = {"Test": ["CMD", "true"], "Interval": -1}


def _volumes(count: int) -> Callable[[dict], None]:
    def edit(config: dict) -> None:
        config["Volumes"] = {f"/data/{i}": {} for i in range(count)}

    return edit


def _stop_signal(size: int) -> Callable[[dict], None]:
    def edit(config: dict) -> None:
        config["StopSignal"] = "SIG" + "T" * size

    return edit


async def test_a_hand_made_image_configuration_is_refused_before_its_start(local_market, docker_client) -> None:
    """What `docker build` refuses, a registry serves: a
    negative healthcheck interval, which the engine takes from an image and
    probes back to back; a 300 KiB STOPSIGNAL, copied into every container
    (20 MB of it made every container list of the engine take seconds); a 2 MB
    one, over what the agent reads of an inspect. Each is refused before `up`."""
    renter, _parts, _local = local_market
    rental_id = await renter.rental()
    stack = STACK.replace(HOSTILE_IMAGE, HAND_MADE)
    try:
        for edit, said in (
            (_negative_interval, 'service "app" probes its health back to back (Interval -1)'),
            (
                _stop_signal(300 * 1024),
                "KiB (its image's ENV, CMD, labels, healthcheck, STOPSIGNAL...), at most 256 KiB",
            ),
            (_stop_signal(2 * 1024 * 1024), "configuration is over 1,024 KiB"),
            (_volumes(40), "declares 40 VOLUME paths (each an anonymous volume the engine makes and removes)"),
        ):
            await asyncio.to_thread(load_with_config, docker_client, TEST_IMAGE, HAND_MADE, edit)
            outcome = await _outcome(renter, rental_id, stack, "hand-made")
            assert outcome["status"] == wire.ERROR and said in outcome["errorMsg"], (said, outcome)
            assert outcome["errorMsg"].startswith("refused by the sandbox policy: "), outcome
            assert await asyncio.to_thread(_containers, docker_client, outcome["stackId"]) == []
    finally:
        await asyncio.to_thread(docker_client.images.remove, HAND_MADE, force=True)


async def test_an_image_the_renter_asks_pulled_always_is_pulled_and_judged_by_the_agent(
    local_market, docker_client, tmp_path
) -> None:
    """`pull_policy: always` once let Compose pull the image at `up`, after the
    agent's check of the local images: a container probing back to back ran
    while `up` waited on a dependent's healthcheck. The
    agent pulls it itself, at each deploy, judges it before `up`, and Compose
    pulls nothing (`pull_policy: never` in the file it reads)."""
    renter, _parts, _local = local_market
    await asyncio.to_thread(load_with_config, docker_client, TEST_IMAGE, REGISTRY_MADE, _negative_interval)
    try:
        await asyncio.to_thread(docker_client.images.push, REGISTRY_MADE)
    finally:
        await asyncio.to_thread(docker_client.images.remove, REGISTRY_MADE, force=True)
    rental_id = await renter.rental()
    waiter = "  waiter:\n    image: gpuhost-test/busybox:1\n    command: ['sleep', '3600']\n"
    waiter += "    depends_on:\n      app:\n        condition: service_healthy\n"
    text = STACK.replace(HOSTILE_IMAGE, REGISTRY_MADE) + "    pull_policy: always\n" + waiter
    try:
        outcome = await _outcome(renter, rental_id, text, "always")
        assert outcome["status"] == wire.ERROR, outcome
        assert outcome["errorMsg"].startswith("refused by the sandbox policy: "), outcome
        assert 'service "app" probes its health back to back (Interval -1)' in outcome["errorMsg"], outcome
        assert await asyncio.to_thread(_containers, docker_client, outcome["stackId"]) == []
    finally:
        await asyncio.to_thread(docker_client.images.remove, REGISTRY_MADE, force=True)

    fine = f"127.0.0.1:5000/{TEST_IMAGE}"
    outcome = await _outcome(renter, rental_id, STACK.replace(HOSTILE_IMAGE, fine) + "    pull_policy: always\n", "ok")
    assert outcome["status"] == wire.APPLIED, outcome
    agent_file = json.loads(
        await asyncio.to_thread((tmp_path / "state" / "stacks" / outcome["stackId"] / AGENT_FILE).read_text)
    )
    assert agent_file["services"]["app"]["pull_policy"] == "never"


async def test_a_started_container_is_judged_as_the_engine_merged_it(docker_client, tmp_path) -> None:
    """After `up`, each container once more: what started from a tag another deploy
    pulled again between the agent's check and `up`. A container of an image
    probing back to back, labelled as the stack's, fails it."""
    stack_id = f"stack-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(load_with_config, docker_client, TEST_IMAGE, HAND_MADE, _negative_interval)
    engine = DockerEngine()
    try:
        await asyncio.to_thread(
            docker_client.containers.run, HAND_MADE, ["sleep", "3600"], labels={wire.LABEL_STACK: stack_id}, detach=True
        )
        compose = await asyncio.to_thread(lambda: ComposeRunner(find_compose_command(), tmp_path))
        backend = ComposeBackend(compose, engine, None, stop_timeout=1)
        with pytest.raises(StackFailed, match=r"^deploy failed: container .* probes its health back to back"):
            await backend.until_running(stack_id)
    finally:
        await engine.close()
        for container in await asyncio.to_thread(_containers, docker_client, stack_id):
            await asyncio.to_thread(container.remove, force=True)
        await asyncio.to_thread(docker_client.images.remove, HAND_MADE, force=True)

"""Fixtures that need the real Docker Engine (`make test` starts it), and the
`docker` marker on every test in this directory.

Images come from the local build (gpuhost-test/busybox:1) and the registry on
127.0.0.1:5000; nothing is pulled from outside this machine.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from pathlib import Path

import aiohttp
import docker
import pytest
from support import install_chroot
from support.agent_config import make_config
from support.engine import remove_env_resources
from support.fake_nvml import build_lib, forget_loaded_nvml, h100_sxm, write_config
from support.renter import Renter
from support.stacks import TEST_IMAGE
from support.swarm import PREFIX, clear, node_id, swarm

from gpuhost_agent.service.daemon import stop_agent
from gpuhost_agent.service.wiring import build_agent, start_local_marketplace

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Every test under tests/integration/ needs the engine: `-m "not docker"` leaves them out."""
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.docker)


_background: list[subprocess.Popen] = []


def pytest_collection_finish(session):
    """When the install tests are to run, their Debian rootfs and wheelhouse
    (a minute to build in a fresh clone, cached after) start building now, in
    the background, while the tests before them run: their fixtures then
    call the same scripts, which wait on the build's lock and find it done."""
    if os.geteuid() != 0 or not any(item.path.name == "test_install.py" for item in session.items):
        return
    log = HERE.parent / ".rootfs" / "background-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        for script in ("rootfs-debian12.sh", "rootfs-wheelhouse.sh"):
            command = ["bash", str(HERE.parents[1] / "scripts" / script)]
            _background.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT))


def pytest_sessionfinish(session):
    for build in _background:  # a run cut short: the build's lock and stamp keep the cache sound
        if build.poll() is None:
            build.terminate()
            build.wait(30)


@pytest.fixture(scope="session")
def docker_client():
    """The real engine. Not answering is a failure, not a skip: `make test` starts it."""
    client = docker.from_env()
    try:
        client.ping()
    except Exception as exc:  # pragma: no cover - a set-up problem, reported plainly
        pytest.fail(f"no Docker Engine answers ({exc}); run the tests with `make test`, which starts one")
    client.images.get(TEST_IMAGE)
    yield client
    client.close()


@pytest.fixture(scope="session")
def swarm_nodes():
    """One two-node test Swarm for every cluster test module, as (manager id,
    worker id): bringing one up and down costs ~10 s, most of it in `down`. Set
    up outside the event loop; tests take it through shared_swarm, which puts
    it back as it was. test_swarm_cluster.py starts its own, since it checks
    that `down` leaves nothing."""
    with swarm(2):
        yield node_id(1), node_id(2)


@pytest.fixture
def shared_swarm(swarm_nodes):
    """The shared Swarm for one test, cleared after it whatever the test left."""
    yield swarm_nodes
    clear()


SWARM_KEY = "test-environment-key-0123456789"  # GPUHOST_SWARM_KEY of the leader and workers in tests


@pytest.fixture
def worker_port() -> int:
    """A free loopback port for machine 2's worker agent (the leader is told it in GPUHOST_SWARM_WORKERS)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def swarm_tls(tmp_path, shared_swarm):
    """The environment's CA and the leader's and machine 2's certificates, as install.sh
    makes them: machine 2's names its node, which the leader checks when it dials it."""
    from support.door_tls import make_door_tls

    return make_door_tls(tmp_path, node=shared_swarm[1])


@pytest.fixture
async def swarm_leader(tmp_path, monkeypatch, docker_client, shared_swarm, worker_port, swarm_tls):
    """((renter, market, agent), {node id: machine number}): an agent process
    (not started) with GPUHOST_SWARM=leader on the shared Swarm's manager, and
    its local marketplace. It looks for machine 2's worker agent on
    worker_port (swarm_worker starts one)."""
    from support.agent_process import process_world

    library = str(await asyncio.to_thread(build_lib))
    monkeypatch.setenv("DOCKER_HOST", f"unix:///run/{PREFIX}/n1/docker.sock")
    monkeypatch.setenv("FAKE_NVML_CONFIG", f"/run/{PREFIX}/n1/nvml.conf")  # the leader's own machine
    settings = {
        "GPUHOST_SWARM": "leader",
        "GPUHOST_NVML_LIBRARY": library,
        "GPUHOST_GPU_CHECK_IMAGE": TEST_IMAGE,
        "GPUHOST_SWARM_KEY": SWARM_KEY,
        "GPUHOST_SWARM_TLS_DIR": str(swarm_tls.leader),
        "GPUHOST_SWARM_WORKERS": f"{shared_swarm[1]}=127.0.0.1:{worker_port}",
    }
    async with process_world(tmp_path, docker_client, **settings) as made:
        yield made, {node: machine for machine, node in enumerate(shared_swarm, start=1)}


@pytest.fixture
async def swarm_worker(tmp_path, shared_swarm, worker_port, swarm_tls):
    """A started WorkerProcess for machine 2 (its engine's socket), serving the
    leader on 127.0.0.1:worker_port; stopped after."""
    from support.agent_process import WorkerProcess

    worker = WorkerProcess(
        tmp_path / "worker.log",
        worker_port,
        DOCKER_HOST=f"unix:///run/{PREFIX}/n2/docker.sock",
        GPUHOST_NVML_LIBRARY=str(await asyncio.to_thread(build_lib)),
        FAKE_NVML_CONFIG=f"/run/{PREFIX}/n2/nvml.conf",  # machine 2's stand-in GPUs
        GPUHOST_GPU_CHECK_IMAGE=TEST_IMAGE,
        GPUHOST_SWARM="worker",
        GPUHOST_SWARM_KEY=SWARM_KEY,
        GPUHOST_SWARM_TLS_DIR=str(swarm_tls.worker),
        GPUHOST_SWARM_LISTEN=f"127.0.0.1:{worker_port}",
        GPUHOST_STATE_DIR=str(tmp_path / "worker-state"),
    )
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop()


@pytest.fixture
async def local_market(request, tmp_path, docker_client):
    """Local marketplace + agent in this event loop; yields (renter, parts, running marketplace).
    A test's `@pytest.mark.agent_config(name=value)` overrides the agent's configuration."""
    marker = request.node.get_closest_marker("agent_config")
    config = make_config(tmp_path / "state", **(marker.kwargs if marker else {}))
    local = await start_local_marketplace(config)
    parts = build_agent(config, local.base_url, local.state.store.envApiKey)
    agent_task = asyncio.create_task(parts.agent.run())
    await asyncio.wait_for(parts.session.connected.wait(), 10)
    http = aiohttp.ClientSession()
    try:
        yield Renter(http, local.base_url, local.state.store), parts, local
    finally:
        await http.close()
        await stop_agent(parts, agent_task)
        await local.stop()
        await asyncio.to_thread(remove_env_resources, docker_client, local.state.store.envId)


@pytest.fixture
async def gpu_agent(tmp_path, monkeypatch, docker_client):
    """start(heartbeat_seconds=..., gpus=N, **config overrides) -> (renter, parts, local, nvml config path):
    the local marketplace and an agent on a stand-in machine of N H100 GPUs (8 by default)."""
    nvml_config = await asyncio.to_thread(write_config, tmp_path / "nvml.conf", h100_sxm(8))
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(nvml_config))
    running = []

    async def start(heartbeat_seconds: float = 0.5, gpus: int | None = None, **overrides):
        if gpus is not None:
            await asyncio.to_thread(write_config, nvml_config, h100_sxm(gpus))
        nvml_library = str(await asyncio.to_thread(build_lib))
        config = make_config(
            tmp_path / "state",
            nvml_library=nvml_library,
            location="EU-DE-Frankfurt",
            speed_max_bytes=2_000_000,
            speed_max_seconds=2.0,
            gpu_check_image=TEST_IMAGE,
            **overrides,
        )
        local = await start_local_marketplace(config)
        local.state.intervals["heartbeatSeconds"] = heartbeat_seconds
        parts = build_agent(config, local.base_url, local.state.store.envApiKey)
        task = asyncio.create_task(parts.agent.run())
        http = aiohttp.ClientSession()
        running.append((parts, task, local, http))
        return Renter(http, local.base_url, local.state.store), parts, local, nvml_config

    yield start
    for parts, task, local, http in running:
        await http.close()
        if not task.done():
            await stop_agent(parts, task)
        await local.stop()
        await asyncio.to_thread(remove_env_resources, docker_client, local.state.store.envId)
    await asyncio.to_thread(forget_loaded_nvml)


# ---- install.sh's chroots (tests/support/install_chroot.py) ---------------------------


@pytest.fixture(scope="session")
def rootfs() -> Path:
    return install_chroot.build_rootfs()


@pytest.fixture(scope="session")
def agent_wheels(tmp_path_factory) -> Path:
    """The dependency wheelhouse (cached) and a wheel of the agent as it is now."""
    return install_chroot.build_agent_wheels(tmp_path_factory.mktemp("agent-wheel"))


@pytest.fixture
def scenario(rootfs, agent_wheels, tmp_path):
    """A fresh chroot with this checkout in /root/gpuhost-agent and the apt stand-ins."""
    made = install_chroot.make_scenario(rootfs, agent_wheels, tmp_path)
    yield made
    install_chroot.drop_scenario(made)

"""A modern host, real all the way down: Debian 13 booted with
systemd 257 as PID 1, Docker 26 with the systemd cgroup driver, the Compose
plugin, /var/lib/docker on btrfs (tests/support/modern_host.py). On it, exactly
what a host does: the marketplace's install line, the agent under systemd,
then the renter API. One booted host for the whole module; the tests run in
order and each builds on the one before (install, deploy and limits, the
watchdog while that deploy's job may still be open, a deploy into the
restarted agent's slice, an OOM kill at a rental's limit, a write past its
disk share, journal, upgrades the marketplace offers (one that works, one
that crashes, one never healthy), stop, upgrade in place, GPUs through CDI
without the runtime hook, uninstall). Needs root.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from support import agent_release, fake_cuda, locks, modern_host
from support.install_chroot import needs_root
from support.market_tls import make_market_tls
from support.renter import Renter
from support.renter_streams import create_terminal, terminal_until
from support.stacks import TEST_IMAGE

from gpuhost_agent.core.stacks.container_list import RENTAL_MEMORY_REACHED
from gpuhost_agent.local_marketplace import server as local_server
from gpuhost_agent.local_marketplace.install_release import InstallRelease
from gpuhost_agent.local_marketplace.releases import Release
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import wire
from gpuhost_agent.protocol.wire_release import ROLLED_BACK, UPGRADED
from gpuhost_agent.runtime.rental_slices import slice_name

pytestmark = [needs_root, pytest.mark.modern_host, pytest.mark.asyncio(loop_scope="module")]

UNIT = "gpuhost-agent.service"
CUDA_IMAGE = "gpuhost-test/cuda-check:1"  # scripts/build-test-images.sh: section 2's CUDA program, nothing of CUDA
SLEEPER = f"services:\n  probe:\n    image: {TEST_IMAGE}\n    command: ['sleep', '3600']\n"


class World:
    """The booted host, the marketplace it was installed from, and what the tests left for the next."""

    def __init__(self, host: modern_host.ModernHost, renter: Renter, base: str):
        self.host, self.renter, self.base = host, renter, base
        self.rental_id = ""
        self.container_id = ""
        self.state: MarketplaceState
        self.wheel: Path  # the agent's wheel, as installed; the upgrade tests' releases are made from it
        self.releases: Path


@pytest.fixture(scope="module")
def booted_host(tmp_path_factory, agent_wheels):
    rootfs, wheels = modern_host.build()
    with modern_host.booted(tmp_path_factory.mktemp("modern-host"), rootfs, wheels, agent_wheels) as host:
        yield host


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(booted_host, agent_wheels, tmp_path_factory):
    """The local marketplace, listening on the host's network's gateway (this machine)."""
    store = Store.load_or_create(None)
    state = MarketplaceState(store)
    # Over HTTPS, its CA in the host's trust store: an agent takes plain http from its own machine alone.
    tls = await asyncio.to_thread(make_market_tls, tmp_path_factory.mktemp("market-tls"), booted_host.gateway)
    ca = await asyncio.to_thread(tls.ca.read_text)
    await asyncio.to_thread(
        booted_host.sh,
        f"cat > /usr/local/share/ca-certificates/gpuhost-test.crt <<'EOF'\n{ca}EOF\nupdate-ca-certificates",
    )
    # The release the install line installs: the agent's wheel, signed by this marketplace.
    installed = await asyncio.to_thread(lambda: Release.of_wheel(agent_release.agent_wheel(agent_wheels)))
    state.install_release = InstallRelease(lambda: installed, None, tmp_path_factory.mktemp("built"))
    market = await local_server.start(state, booted_host.gateway, 0, tls=tls.server())
    assert market.base_url.startswith("https://")
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client()))
    try:
        made = World(booted_host, Renter(http, market.base_url, store), market.base_url)
        made.state, made.wheel = state, agent_release.agent_wheel(agent_wheels)
        made.releases = tmp_path_factory.mktemp("releases")
        yield made
    finally:
        await http.close()
        await market.stop()


# The stand-in NVML answers a process given its configuration (the unit has it from systemd's environment).
WITH_NVML = "FAKE_NVML_CONFIG=/etc/fake-nvml.conf"


async def _sh(world: World, script: str, **kwargs) -> modern_host.Run:
    return await asyncio.to_thread(world.host.sh, script, **kwargs)


async def _deployed(world: World, rental_id: str, content: str, name: str) -> tuple[str, dict]:
    """A one-container stack deployed through the renter API and APPLIED: its container's id and docker inspect."""
    stack_id = await world.renter.stack(rental_id, content, name=name)
    stack = await world.renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=120)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    listed = await _sh(world, f"docker ps -q --filter label={wire.LABEL_STACK}={stack_id}")
    (container,) = listed.out.split()
    return container, json.loads((await _sh(world, f"docker inspect {container}")).out)[0]


async def _main_pid(world: World) -> int:
    return int((await asyncio.to_thread(world.host.show, UNIT, "MainPID"))["MainPID"])


async def _connected(world: World, timeout: float = 60) -> None:
    """The agent has opened its session (the host's initState says ready)."""
    deadline = time.monotonic() + timeout
    while (world.renter.store.host.get("initState") or {}).get("state") != "ready":
        if time.monotonic() > deadline:
            said = await _sh(
                world, f"systemctl status --no-pager {UNIT}; journalctl --no-pager -u {UNIT} -n 40", check=False
            )
            raise AssertionError(f"the agent did not connect: {world.renter.store.host.get('initState')}\n{said.both}")
        await asyncio.sleep(0.2)


async def test_the_install_line_installs_and_starts_the_agent_under_systemd(world: World) -> None:
    store = world.renter.store
    status, line = await world.renter.call("GET", f"/environments/{store.envId}/script")
    assert status == 200, line
    assert (
        line.startswith(" printf ")
        and " | $(command -v sudo) bash -c " in line
        and f" {world.base}/install.sh --url " in line
    )
    done = await _sh(world, line, timeout=600)  # pip finds the wheelhouse through /etc/pip.conf
    assert store.envApiKey not in done.both
    # The agent itself: the marketplace's release, its signature checked over HTTPS with the key the line pinned.
    assert "(source: the marketplace's signed release)" in done.out, done.both
    assert "dockerd's CDI feature is off" in done.both  # Docker 26: install.sh says how to turn it on
    assert (await _sh(world, "cat /etc/gpuhost-agent/api-key")).out == store.envApiKey + "\n"  # through real sudo
    await _connected(world)
    shown = await asyncio.to_thread(world.host.show, UNIT, "ActiveState", "Type", "WatchdogUSec", "NotifyAccess")
    assert shown == {"ActiveState": "active", "Type": "notify", "WatchdogUSec": "30s", "NotifyAccess": "main"}
    # Under the unit's confinement the agent wrote its egress rules, and doctor judges them so.
    assert "-A GPUHOST-EGRESS -d 169.254.0.0/16 -j REJECT" in (await _sh(world, "iptables -S GPUHOST-EGRESS")).out
    assert "-A DOCKER-USER -i gpuh+ -j GPUHOST-EGRESS" in (await _sh(world, "iptables -S DOCKER-USER")).out
    doctor = json.loads((await _sh(world, "gpuhost-agent doctor --json", check=False)).out)
    (egress,) = [check for check in doctor["checks"] if check["id"] == "container-egress-confined"]
    assert egress["ok"] and not egress["skipped"], egress
    info = json.loads((await _sh(world, "docker info --format '{{json .}}'")).out)
    assert (info["CgroupDriver"], info["ServerVersion"].split(".")[0]) == ("systemd", "26")
    assert (await _sh(world, "docker compose version --short")).out.strip().startswith("2.")
    # Every dependency at the version requirements/agent.lock names for Debian 13's Python 3.13
    dumped = (await _sh(world, f"/opt/gpuhost-agent/venv/bin/python -c {shlex.quote(locks.DUMP)}")).out
    assert json.loads(dumped)["python"].startswith("3.13.")
    assert await asyncio.to_thread(locks.differences, dumped) == []


async def test_a_stack_deploys_in_the_rentals_slice_with_its_limits_as_systemd_reports_them(world: World) -> None:
    renter = world.renter
    world.rental_id = rental_id = await renter.rental(gpu_count=1)
    stack_id = await renter.stack(rental_id, SLEEPER)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=120)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    listed = await _sh(world, f"docker ps -q --filter label={wire.LABEL_RENTAL}={rental_id}")
    (world.container_id,) = listed.out.split()
    box = json.loads((await _sh(world, f"docker inspect {world.container_id}")).out)[0]
    name = slice_name(rental_id)
    assert box["HostConfig"]["CgroupParent"] == name
    memory, cpus = int(box["HostConfig"]["Memory"]), box["HostConfig"]["NanoCpus"] / 1e9
    shown = await asyncio.to_thread(
        world.host.show, name, "ActiveState", "MemoryMax", "MemoryLimit", "TasksMax", "CPUQuotaPerSecUSec"
    )
    assert shown["ActiveState"] == "active", shown
    # cgroup v1 here (this machine's kernel): systemd applies MemoryLimit= (v2 hosts: MemoryMax=).
    assert str(memory) in (shown["MemoryMax"], shown["MemoryLimit"]), shown
    assert int(shown["TasksMax"]) > 0, shown
    assert shown["CPUQuotaPerSecUSec"] == _usec(max(0.01, cpus)), shown
    # ...and the kernel holds what systemd says: the slice's own cgroup files.
    folder = f"/sys/fs/cgroup/memory/gpuhost.slice/{name}"
    limit = (await _sh(world, f"cat '{folder}/memory.limit_in_bytes'")).out.strip()
    assert int(limit) == memory


async def test_a_hung_agent_is_killed_by_the_watchdog_and_the_restarted_one_leaves_stacks_running(
    world: World,
) -> None:
    """Right after the deploy: the agent may be stopped before its deploy job
    is finished, and the restarted one then gets the job again from the
    marketplace and applies it to the stack that runs. That redeploy failed
    at the rental's slice (systemd 257's words for a slice that exists) and
    the failure took the container down: what this test once saw."""
    before = await _main_pid(world)
    started = (await _sh(world, f"docker inspect -f '{{{{.State.StartedAt}}}}' {world.container_id}")).out
    await _sh(world, f"kill -STOP {before}")
    deadline = time.monotonic() + 30 + 5 + 30  # WatchdogSec, RestartSec, a start
    while (after := await _main_pid(world)) in (before, 0):
        assert time.monotonic() < deadline, "systemd did not restart the stopped agent"
        await asyncio.sleep(0.5)
    result = await asyncio.to_thread(world.host.show, UNIT, "NRestarts")
    assert int(result["NRestarts"]) >= 1
    journal = await asyncio.to_thread(world.host.journal, UNIT)
    assert any("Watchdog timeout" in str(entry.get("MESSAGE")) for entry in journal), "no watchdog kill logged"
    await asyncio.to_thread(
        world.host.wait, f"systemctl show {UNIT} -p StatusText --value | grep -q .", 60, "the restarted agent ready"
    )
    await _sh(world, f"systemctl is-active {UNIT}")
    await asyncio.sleep(5)  # its first reconcile
    assert (await _sh(world, f"docker inspect -f '{{{{.State.StartedAt}}}}' {world.container_id}")).out == started
    assert after != before


async def test_the_restarted_agent_deploys_into_a_rental_whose_slice_it_did_not_start(world: World) -> None:
    """The rental's slice outlives the agent that started it (transient
    slices last until reboot): the restarted agent's StartTransientUnit is
    refused, in systemd 257's words "was already loaded or has a fragment
    file", and the limits go on the existing slice. The agent knew only older
    systemd's "already exists": the stack failed, and a deploy job handed out
    again after the watchdog's kill took the running stack down with it."""
    rental_id = world.rental_id
    _container, box = await _deployed(world, rental_id, SLEEPER, "after the restart")
    assert box["HostConfig"]["CgroupParent"] == slice_name(rental_id)
    shown = await asyncio.to_thread(world.host.show, slice_name(rental_id), "MemoryLimit")
    assert shown["MemoryLimit"] == str(box["HostConfig"]["Memory"]), shown
    assert (await _sh(world, f"docker inspect -f '{{{{.State.Running}}}}' {world.container_id}")).out.strip() == "true"


async def test_a_rental_over_its_memory_is_oom_killed_by_the_kernel_and_told_so(world: World) -> None:
    """Services each under their own memory limit, together over the
    rental's: the kernel kills in the rental's slice (systemd's cgroup, the
    systemd driver), the count of its limit's refusals says so, and the agent tells the
    renter the rental's limit was reached, not the container's own. A rental
    of its own, so the stack the later tests hold is not the kernel's victim.
    cgroup v1 here (this machine's kernel), where systemd says nothing of OOM
    kills: the kernel's word is the slice's memory.failcnt, the times its own
    limit refused a charge (v1 counts `oom_kill` in the victim's cgroup, the
    container's, gone with it: the slice's stays 0; v2 hosts: memory.events)."""
    renter = world.renter
    rental_id = await renter.rental(gpu_count=1)
    name = slice_name(rental_id)
    probe = await renter.stack(rental_id, SLEEPER)
    applied = await renter.wait_stack(rental_id, probe, (wire.APPLIED, wire.ERROR), timeout=120)
    assert applied["status"] == wire.APPLIED, applied["errorMsg"]
    limit = int((await asyncio.to_thread(world.host.show, name, "MemoryLimit"))["MemoryLimit"])
    failures = f"/sys/fs/cgroup/memory/gpuhost.slice/{name}/memory.failcnt"
    assert int((await _sh(world, f"cat '{failures}'")).out) == 0
    stack_id = await renter.stack(rental_id, _filler(int(limit * 0.3)))

    def states() -> list[str]:
        return [c["State"] for c in (renter.store.containers.get(stack_id) or {}).get("containers", [])]

    def told() -> bool:  # the stack's errorMsg, and the killed container's state in its list
        said = (renter.store.stacks.get(stack_id) or {}).get("errorMsg", "")
        return RENTAL_MEMORY_REACHED in said and "exited (137, OOM-killed)" in states()

    deadline = time.monotonic() + 90
    while not told():
        if time.monotonic() > deadline:
            said = await _sh(world, f"cat '{failures}'; docker ps -a", check=False)
            raise AssertionError(f"{renter.store.stacks.get(stack_id)}\n{states()}\nlimit {limit}\n{said.both}")
        await asyncio.sleep(0.5)
    assert int((await _sh(world, f"cat '{failures}'")).out) >= 1
    killed = (
        await _sh(world, f"docker ps -aq --filter label={wire.LABEL_STACK}={stack_id} --filter status=exited")
    ).out
    for container in killed.split():
        state = json.loads((await _sh(world, f"docker inspect -f '{{{{json .State}}}}' {container}")).out)
        assert (state["OOMKilled"], state["ExitCode"]) == (True, 137), state
    assert killed.split(), "no filler exited"


def _filler(size_bytes: int) -> str:
    """Four services whose main process (tail, reading `size_bytes` from a
    FIFO) holds that much anonymous memory, then waits on a pipe nobody
    reads (as test_rental_cgroups_engine's): each alone under its own limit,
    together over the rental's."""
    script = (
        "mkfifo /w/in /w/out; exec 3<>/w/out; sleep 8; "
        f"head -c {size_bytes} /dev/zero > /w/in & exec tail -c {size_bytes} /w/in >&3"
    )
    service = f'    image: {TEST_IMAGE}\n    command: ["sh", "-c", "{script}"]\n    tmpfs: ["/w"]\n'
    return "services:\n" + "".join(f"  filler{n}:\n{service}" for n in range(4))


def _usec(cpus: float) -> str:
    """systemd's spelling of CPUQuotaPerSecUSec (1.5 CPUs: 1.500000s)."""
    seconds = int(cpus * 1_000_000) / 1_000_000
    text = f"{seconds:.6f}".rstrip("0").rstrip(".")
    return f"{text}s" if seconds >= 1 else f"{int(cpus * 1000)}ms"


async def test_a_container_writing_past_the_rentals_disk_share_gets_edquot_from_the_kernel(world: World) -> None:
    """/var/lib/docker is btrfs with dockerd's btrfs driver (XFS project
    quotas cannot be had with this machine's kernel, docs/hosts.md): the
    agent's probe says a size holds there, the rental's container gets the
    rental's disk share as its size, and the kernel refuses a write past it
    (a btrfs quota group: EDQUOT, "Disk quota exceeded")."""
    assert (await _sh(world, "findmnt -no FSTYPE /var/lib/docker")).out.strip() == "btrfs"
    facts = world.renter.store.host.get("facts") or world.renter.store.host
    quota = _find(facts, "storageQuota")
    assert quota == {"available": True, "detail": "btrfs with quota groups at /var/lib/docker"}, facts
    box = json.loads((await _sh(world, f"docker inspect {world.container_id}")).out)[0]
    size = int((box["HostConfig"].get("StorageOpt") or {}).get("size") or 0)
    assert size > 0, box["HostConfig"].get("StorageOpt")
    past = size // (1 << 20) + 64  # MiB
    wrote = await _sh(
        world, f"docker exec {world.container_id} dd if=/dev/zero of=/fill bs=1M count={past}", check=False, timeout=300
    )
    assert wrote.code != 0 and "Disk quota exceeded" in wrote.both, (size, wrote.both)
    await _sh(world, f"docker exec {world.container_id} rm /fill")


def _find(tree, key: str):
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for value in tree.values():
            found = _find(value, key)
            if found is not None:
                return found
    return None


async def test_the_journal_has_the_agents_json_lines_with_priorities_and_no_secret(world: World) -> None:
    journal = await asyncio.to_thread(world.host.journal, UNIT)
    ours = [entry for entry in journal if entry.get("SYSLOG_IDENTIFIER") == "gpuhost-agent"]
    lines = []
    for entry in ours:
        message = entry.get("MESSAGE")
        if isinstance(message, str) and message.startswith("{"):
            lines.append((json.loads(message), int(entry["PRIORITY"])))
    assert lines, [entry.get("MESSAGE") for entry in ours][:20]
    levels = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}  # syslog's LOG_WARNING is 4
    for record, priority in lines:
        assert priority == levels[record["level"]], (record, priority)
    whole = json.dumps(journal)
    assert world.renter.store.envApiKey not in whole
    assert world.renter.store.renterApiKey not in whole


# ---- upgrades the marketplace offers -------------------------------------------------------------------------------
HEALTH_SECONDS = 20  # the trial's bound here (GPUHOST_UPGRADE_HEALTH_SECONDS; 300 by default)


async def _offer(world: World, version: str, appended: dict[str, str] | None = None) -> Release:
    wheel = await asyncio.to_thread(agent_release.variant, world.wheel, world.releases / version, version, appended)
    world.state.release = await asyncio.to_thread(Release.of_wheel, wheel)
    return world.state.release


async def _told(world: World, version: str, outcome: str, running: str, timeout: float = 180) -> dict:
    """What the agent told the marketplace of its last attempt, once it is `outcome` for `version`."""
    deadline = time.monotonic() + timeout
    while True:
        said = world.renter.store.host.get("agentUpgrade") or {}
        attempt = said.get("lastAttempt") or {}
        if (attempt.get("version"), attempt.get("outcome"), said.get("running")) == (version, outcome, running):
            return attempt
        if time.monotonic() > deadline:
            log = await _sh(world, f"journalctl --no-pager -u {UNIT} -n 60 -o cat", check=False)
            raise AssertionError(f"not told {version} {outcome}, running {running}: {said}\n{log.out[-6000:]}")
        await asyncio.sleep(0.5)


async def _agent_program(world: World) -> str:
    """The program the unit's main process runs (the launcher execs the chosen version in place)."""
    return (await _sh(world, f"tr '\\0' ' ' </proc/{await _main_pid(world)}/cmdline")).out


async def _started_at(world: World) -> str:
    return (await _sh(world, f"docker inspect -f '{{{{.State.StartedAt}}}}' {world.container_id}")).out


async def test_an_offered_release_is_installed_beside_the_agent_and_runs_after_its_health_check(world: World) -> None:
    started = await _started_at(world)
    await _sh(world, f"echo GPUHOST_UPGRADE_HEALTH_SECONDS={HEALTH_SECONDS} >>/etc/gpuhost-agent/agent.conf")
    world.state.intervals["heartbeatSeconds"] = 3  # offers reach a running agent at its beats
    await _offer(world, "0.1.1")
    await _sh(world, f"systemctl restart {UNIT}")  # the setting above; the session reply then offers 0.1.1
    await _told(world, "0.1.1", UPGRADED, "0.1.1")  # told at the session after its confirmation
    assert "/var/lib/gpuhost-agent/versions/0.1.1-" in await _agent_program(world)
    record = json.loads((await _sh(world, "cat /var/lib/gpuhost-agent/upgrade.json")).out)
    assert record["current"]["version"] == "0.1.1" and record["trial"] is None
    assert world.renter.store.host["agentUpgrade"]["lastAttempt"]["from"] is None  # from install.sh's version
    assert await _started_at(world) == started  # the renter's container was never touched


async def test_a_release_that_crashes_at_start_is_rolled_back_and_the_marketplace_told_why(world: World) -> None:
    started = await _started_at(world)
    await _offer(world, "0.1.2", {"gpuhost_agent/service/daemon.py": agent_release.CRASH_AT_START})
    attempt = await _told(world, "0.1.2", ROLLED_BACK, "0.1.1")  # offered at a beat of 0.1.1
    assert "stopped before it passed its health check" in attempt["reason"] and attempt["from"] == "0.1.1"
    assert "/var/lib/gpuhost-agent/versions/0.1.1-" in await _agent_program(world)
    journal = (await _sh(world, f"journalctl --no-pager -u {UNIT} -o cat")).out
    assert "this release crashes at start" in journal and "rolled back to 0.1.1" in journal
    assert await _started_at(world) == started
    sessions = world.state.sessions_opened
    await asyncio.sleep(8)  # beats that offer the same build again: not tried again
    assert world.state.sessions_opened == sessions
    assert "0.1.2" not in (await _sh(world, "ls /var/lib/gpuhost-agent/versions")).out


async def test_a_release_that_never_becomes_healthy_is_stopped_at_its_bound_and_rolled_back(world: World) -> None:
    started = await _started_at(world)
    await _offer(world, "0.1.3", {"gpuhost_agent/core/agent.py": agent_release.NEVER_HEALTHY})
    attempt = await _told(world, "0.1.3", ROLLED_BACK, "0.1.1")
    assert f"within {HEALTH_SECONDS} s" in attempt["reason"], attempt
    assert "/var/lib/gpuhost-agent/versions/0.1.1-" in await _agent_program(world)
    assert await _started_at(world) == started
    world.state.release = None
    world.state.intervals["heartbeatSeconds"] = 30


async def test_systemctl_stop_stops_the_agent_within_its_timeout_and_leaves_stacks(world: World) -> None:
    timeout = (await asyncio.to_thread(world.host.show, UNIT, "TimeoutStopUSec"))["TimeoutStopUSec"]
    seconds = int(re.fullmatch(r"(\d+)s", timeout).group(1))
    began = time.monotonic()
    await _sh(world, f"systemctl stop {UNIT}", timeout=seconds + 30)
    took = time.monotonic() - began
    shown = await asyncio.to_thread(world.host.show, UNIT, "ActiveState", "Result")
    assert shown == {"ActiveState": "inactive", "Result": "success"}, shown
    assert took < seconds
    running = (await _sh(world, f"docker inspect -f '{{{{.State.Running}}}}' {world.container_id}")).out.strip()
    assert running == "true"


async def test_an_upgrade_in_place_keeps_the_configuration_and_state(world: World) -> None:
    keep = "/etc/gpuhost-agent/agent.conf /etc/gpuhost-agent/api-key"
    # What a stopped agent leaves is kept; a running one adds its socket and SQLite's -wal and -shm files.
    # The versions the marketplace installed are not: the host's own install is the one that runs.
    upgrades = "-e '^upgrade[.]' -e '^versions$'"
    kept = f"sha256sum {keep}; ls /var/lib/gpuhost-agent | grep -v -e '-wal$' -e '-shm$' -e '[.]sock$' {upgrades}"
    before = (await _sh(world, kept)).out
    assert "versions" in (await _sh(world, "ls /var/lib/gpuhost-agent")).out  # the upgrade tests' 0.1.1
    await _sh(world, f"curl -fsSL {world.base}/install.sh | sudo bash -s --", timeout=600)
    assert (await _sh(world, kept)).out == before
    left = (await _sh(world, "ls /var/lib/gpuhost-agent")).out.split()
    assert "versions" not in left and "upgrade.json" not in left, left
    await asyncio.to_thread(world.host.wait, f"systemctl is-active {UNIT}", 60, "the upgraded agent running")
    assert "/opt/gpuhost-agent/venv/bin/gpuhost-agent" in await _agent_program(world)
    running = (await _sh(world, f"docker inspect -f '{{{{.State.Running}}}}' {world.container_id}")).out.strip()
    assert running == "true"


async def test_gpus_reach_containers_through_cdi_without_the_runtime_hook(world: World) -> None:
    """The host made CDI-only (modern_host.TO_CDI: a CDI spec for the
    stand-in GPUs, dockerd's CDI feature on, no runtime hook, so dockerd has
    no nvidia device driver): the restarted agent's probe says cdi, and a
    1-GPU stack deploys with a `driver: cdi` request naming the rental's GPU by
    UUID; inside, that GPU's CDI edits (its device node, its variable) and no
    other GPU's. With the sandbox's `driver: nvidia` requests the engine
    refuses the container ("could not select device driver"). The host stays
    CDI-only: only the uninstall test comes after, and it needs no GPU."""
    began = time.monotonic()
    host, renter = world.host, world.renter
    written = await asyncio.to_thread(
        host.run, "sh", "-c", f"mkdir -p /etc/cdi && cat >{modern_host.CDI_SPEC}", input=modern_host.cdi_spec()
    )
    assert written.code == 0, written.both
    await _sh(world, modern_host.TO_CDI, timeout=120)
    info = json.loads((await _sh(world, "docker info --format '{{json .}}'")).out)
    assert info.get("CDISpecDirs"), "dockerd's CDI feature is off"
    deadline = time.monotonic() + 60
    while (_find(renter.store.host, "gpuDelivery") or {}).get("method") != "cdi":
        assert time.monotonic() < deadline, _find(renter.store.host, "gpuDelivery")
        await asyncio.sleep(0.2)
    probed = (await _sh(world, f"{WITH_NVML} gpuhost-agent probe")).out
    assert re.search(r"^GPU delivery +cdi: dockerd's CDI feature on; /etc/cdi/nvidia.yaml names 64 GPU", probed, re.M)
    assert re.search(r"^Agent's CDI spec +/etc/cdi/nvidia.yaml names the GPUs by UUID: used as it is$", probed, re.M)

    rental_id = await renter.rental(gpu_count=1)
    content = (
        SLEEPER
        + "    deploy: {resources: {reservations: {devices: [{driver: nvidia, count: 1, capabilities: [gpu]}]}}}\n"
    )
    container, box = await _deployed(world, rental_id, content, "through CDI")
    (uuid,) = box["Config"]["Labels"]["io.gpuhost.gpus"].split(",")
    (request,) = box["HostConfig"]["DeviceRequests"]
    assert (request["Driver"], request["DeviceIDs"]) == ("cdi", [f"nvidia.com/gpu={uuid}"]), request
    index = modern_host.gpu_index(uuid)
    # The container's own environment (its first process's, NUL-separated): CDI edits the OCI spec, not the
    # Config.Env that `docker exec` gets.
    said = (await _sh(world, f"docker exec {container} sh -c 'ls /dev; cat /proc/1/environ'")).out
    inside = said.replace("\0", "\n").split()
    assert sorted(name for name in inside if name.startswith("nvidia")) == sorted([f"nvidia{index}", "nvidiactl"])
    assert [line for line in inside if line.startswith(modern_host.CDI_ENV)] == [f"{modern_host.CDI_ENV}{index}={uuid}"]
    assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in inside
    print(f"CDI test: {time.monotonic() - began:.1f} s")


async def test_without_a_spec_naming_the_gpus_the_agent_writes_its_own_from_the_driver(
    world: World, tmp_path: Path
) -> None:
    """The same CDI-only host without the toolkit's spec. The agent writes one
    itself from what the driver has (NVML's UUIDs and minor numbers, the device nodes, the driver's
    libraries of its version, nvidia-smi), no hook in it; a 1-GPU stack gets its GPU's node, the
    shared one and the driver's files, and no other GPU's node. Section 2's CUDA program
    (scripts/gpu-machine/cuda-check.c), run in that container through the renter's terminal,
    finds the stand-in driver's libcuda by the spec's mounts and sees the rental's GPU alone."""
    await _sh(world, f"rm -f {modern_host.CDI_SPEC}")
    version = modern_host.DRIVER_VERSION
    libcuda = await asyncio.to_thread(fake_cuda.build_stand_in, tmp_path, modern_host.gpu_uuids())
    libdir = "/usr/lib/x86_64-linux-gnu"
    built = await asyncio.to_thread(libcuda.read_bytes)
    put = await asyncio.to_thread(world.host.run, "sh", "-c", f"cat >{libdir}/libcuda.so.{version}", input=built)
    assert put.code == 0, put.both
    await _sh(
        world,
        f"cd {libdir} && echo stand-in >libnvidia-ptxjitcompiler.so.{version} && "
        f"for lib in libcuda libnvidia-ptxjitcompiler; do ln -sf $lib.so.{version} $lib.so.1; done",
    )
    saved = await asyncio.to_thread(
        subprocess.run, ["docker", "save", CUDA_IMAGE], capture_output=True, check=True, timeout=120
    )
    loaded = await asyncio.to_thread(world.host.run, "docker", "load", input=saved.stdout)
    assert loaded.code == 0, loaded.both
    await _sh(world, f"systemctl restart {UNIT}")
    await _connected(world)
    deadline = time.monotonic() + 60
    while (_find(world.renter.store.host, "cdiSpec") or {}).get("path") != "/etc/cdi/gpuhost-nvidia.yaml":
        assert time.monotonic() < deadline, _find(world.renter.store.host, "cdiSpec")
        await asyncio.sleep(0.2)
    assert _find(world.renter.store.host, "gpuDelivery")["method"] == "cdi"
    spec = (await _sh(world, "cat /etc/cdi/gpuhost-nvidia.yaml")).out
    assert "hooks" not in spec and f"libcuda.so.{version}" in spec, spec
    # probe and doctor say which spec is in use and why, and write nothing of it.
    probed = (await _sh(world, f"{WITH_NVML} gpuhost-agent probe")).out
    own = f"/etc/cdi/gpuhost-nvidia.yaml, in place for {modern_host.GPUS} GPU(s), driver {version}"
    assert re.search(rf"^Agent's CDI spec +{re.escape(own)}$", probed, re.M), probed
    doctor = json.loads((await _sh(world, f"{WITH_NVML} gpuhost-agent doctor --json", check=False)).out)
    (gpus,) = [check for check in doctor["checks"] if check["id"] == "gpu-containers"]
    assert gpus["ok"] and "/etc/cdi/gpuhost-nvidia.yaml names" in gpus["summary"], gpus

    rental_id = await world.renter.rental(gpu_count=1)
    content = (
        f"services:\n  cuda:\n    image: {CUDA_IMAGE}\n    command: ['sleep', '3600']\n"
        "    deploy: {resources: {reservations: {devices: [{driver: nvidia, count: 1, capabilities: [gpu]}]}}}\n"
    )
    container, box = await _deployed(world, rental_id, content, "through the agent's CDI spec")
    (uuid,) = box["Config"]["Labels"]["io.gpuhost.gpus"].split(",")
    index = modern_host.gpu_index(uuid)
    said = await _sh(world, f"docker exec {container} ls /dev")
    assert sorted(name for name in said.out.split() if name.startswith("nvidia")) == sorted(
        [f"nvidia{index}", "nvidiactl"]
    ), said.out
    # The driver's tool where the host has it (the stand-in's: /usr/local/bin), mounted from the host.
    assert (await _sh(world, f"docker exec {container} test -f /usr/local/bin/nvidia-smi", check=False)).code == 0
    assert "/usr/local/bin/nvidia-smi" in spec

    status, terminal = await create_terminal(
        world.renter.http,
        world.renter.base_url,
        world.renter.store.renterApiKey,
        rental_id,
        box["Config"]["Labels"][wire.LABEL_STACK],
        box["Id"],
    )
    assert status == 201, terminal
    async with world.renter.http.ws_connect(terminal["url"]) as ws:
        # The quotes keep the terminal's echo of the line from reading as the end of its output.
        await ws.send_bytes(b'cuda-check 16; echo cuda-check-ex""it=$?\n')
        seen = await terminal_until(ws, "cuda-check-exit=", timeout=60)
    lines = [line.strip() for line in seen.splitlines()]
    assert "cuda-check: devices 1" in lines, seen
    assert any(line.startswith(f"cuda-check: device 0 {uuid} ") for line in lines), seen
    assert "cuda-check: PASS" in lines and "cuda-check-exit=0" in lines, seen

    # dockerd starts renters' containers again at boot, before the agent, and a GPU's
    # node number follows the order the driver found the GPUs in. Docker's unit makes the agent's spec
    # true first (install.sh's drop-in: `gpuhost-agent cdi refresh`): one from before (here the first
    # two GPUs' nodes swapped, with the agent stopped) is rewritten before dockerd reads it.
    good = (await _sh(world, "cat /etc/cdi/gpuhost-nvidia.yaml")).out
    await _sh(world, f"systemctl stop {UNIT}")
    swap = "s#/dev/nvidia0$#/dev/nvidiaX#; s#/dev/nvidia1$#/dev/nvidia0#; s#/dev/nvidiaX$#/dev/nvidia1#"
    await _sh(world, f"sed -i '{swap}' /etc/cdi/gpuhost-nvidia.yaml")
    assert (await _sh(world, "cat /etc/cdi/gpuhost-nvidia.yaml")).out != good
    # reset-failed: Docker's unit allows 3 starts a minute, and the tests after this one restart it too.
    await _sh(world, "systemctl restart docker && systemctl reset-failed docker.service", timeout=120)
    assert (await _sh(world, "cat /etc/cdi/gpuhost-nvidia.yaml")).out == good
    said = (await _sh(world, "journalctl --no-pager -u docker -n 60")).out
    assert "/etc/cdi/gpuhost-nvidia.yaml: written for" in said, said
    await _sh(world, f"systemctl start --no-block {UNIT}")
    await _connected(world)


async def test_after_a_reboot_dockerd_starts_behind_the_egress_rules(world: World) -> None:
    """A reboot empties the kernel's rules, and dockerd, which starts renters' containers again, starts
    before the agent: Docker's unit (install.sh's drop-in) writes them first, DOCKER-USER included."""
    await _sh(world, f"systemctl stop {UNIT}; gpuhost-agent egress remove")
    assert (await _sh(world, "iptables -S GPUHOST-EGRESS", check=False)).code != 0
    await _sh(world, "systemctl restart docker", timeout=120)
    assert "-A GPUHOST-EGRESS -d 169.254.0.0/16 -j REJECT" in (await _sh(world, "iptables -S GPUHOST-EGRESS")).out
    listed = (await _sh(world, "iptables -S DOCKER-USER")).out.splitlines()
    assert [line for line in listed if line.startswith("-A ")][0] == "-A DOCKER-USER -i gpuh+ -j GPUHOST-EGRESS"
    await _sh(world, f"systemctl start --no-block {UNIT}")
    await _connected(world)


async def test_dockerd_pulls_through_the_pull_guard_and_a_name_of_the_host_reaches_nothing(world: World) -> None:
    """dockerd resolves a renter's registry name again when it pulls. With Docker's drop-in
    in force, dockerd asks the agent's pull guard, which refuses a name that resolves to the host (here the
    machine's own host name) before any byte reaches the host's service, and asks the host's proxy (here the
    discard port, as before) for the address it judged of any other."""
    dropin = (await _sh(world, "cat /etc/systemd/system/docker.service.d/zz-gpuhost-pull-guard.conf")).out
    assert 'Environment="HTTP_PROXY=http://127.0.0.1:47128" "HTTPS_PROXY=http://127.0.0.1:47128"' in dropin
    # This host's daemon.json names a proxy, which wins over the drop-in: the host does what install.sh's
    # warning says (its proxy becomes the guard's upstream), then restarts Docker and the agent.
    python = "/opt/gpuhost-agent/venv/bin/python"
    await _sh(
        world,
        f'{python} -c \'import json; p="/etc/docker/daemon.json"; d=json.load(open(p)); d.pop("proxies"); '
        'json.dump(d, open(p, "w"))\' && echo GPUHOST_PULL_GUARD_UPSTREAM=http://127.0.0.1:9 >>'
        "/etc/gpuhost-agent/agent.conf",
    )
    await _sh(world, f"systemctl restart docker && systemctl restart {UNIT}", timeout=180)
    await _connected(world)
    info = json.loads((await _sh(world, "docker info --format '{{json .}}'")).out)
    assert (info["HttpProxy"], info["HttpsProxy"]) == ("http://127.0.0.1:47128",) * 2, info
    await _sh(world, "cd /tmp && setsid python3 -m http.server 5999 >/tmp/host-service.log 2>&1 </dev/null & sleep 1")
    assert "200 OK" in (await _sh(world, "curl -sS -i --noproxy '*' http://modern-host:5999/ | head -1")).out
    await _sh(world, ": >/tmp/host-service.log")
    pulled = await _sh(world, "docker pull modern-host:5999/renter/image:1", check=False, timeout=120)
    assert pulled.code != 0 and "an address of this host: the host's engine does not go there" in pulled.both, pulled
    assert "GET" not in (await _sh(world, "cat /tmp/host-service.log")).out  # nothing reached the host's service
    # Go sends a loopback target to no proxy (a registry's redirect or token realm naming 127.0.0.1):
    # dockerd is in the engine fence's group, and the kernel refuses its connection.
    groups = (await _sh(world, "grep ^Groups: /proc/$(pidof dockerd)/status; getent group gpuhost-engine")).out
    assert groups.split("\n")[1].split(":")[2] in groups.split("\n")[0].split(), groups
    pulled = await _sh(world, "docker pull 127.0.0.1:5999/renter/image:1", check=False, timeout=120)
    assert pulled.code != 0 and "connection refused" in pulled.both, pulled
    assert "GET" not in (await _sh(world, "cat /tmp/host-service.log")).out
    pulled = await _sh(world, "docker pull 203.0.113.7:5000/renter/image:1", check=False, timeout=120)
    assert pulled.code != 0 and "the upstream proxy 127.0.0.1:9 did not answer" in pulled.both, pulled
    doctor = json.loads((await _sh(world, "gpuhost-agent doctor --json", check=False)).out)
    (guarded,) = [check for check in doctor["checks"] if check["id"] == "registry-pulls-guarded"]
    assert guarded["ok"] and not guarded["skipped"], guarded
    await _sh(world, "pkill -f '[h]ttp.server 5999' || true")  # [h]: not this shell's own command line


async def test_uninstall_with_purge_leaves_nothing(world: World) -> None:
    await _sh(world, f"curl -fsSL {world.base}/install.sh | sudo bash -s -- --uninstall --purge", timeout=300)
    left = await _sh(
        world,
        "ls -d /opt/gpuhost-agent /etc/gpuhost-agent /var/lib/gpuhost-agent /usr/local/bin/gpuhost-agent "
        "/etc/systemd/system/gpuhost-agent.service /etc/systemd/system/gpuhost-agent.service.d "
        "/etc/systemd/system/multi-user.target.wants/gpuhost-agent.service 2>&1 || true",
    )
    assert left.out.count("No such file or directory") == 7, left.out
    assert (await _sh(world, "iptables -S GPUHOST-EGRESS", check=False)).code != 0  # the agent's rules went too
    dropins = await _sh(world, "ls /etc/systemd/system/docker.service.d 2>&1 || true")
    assert "No such file or directory" in dropins.out, dropins.out
    units = (await _sh(world, f"systemctl list-units --all --no-legend {UNIT} || true")).out
    assert "gpuhost-agent.service" not in units or "not-found" in units, units

"""The machine as the marketplace sees it: the agent probes a stand-in 8-GPU
NVLink machine (real pynvml on the fake NVML library, real Docker, real
Compose), reports over real HTTP, and the local marketplace's Environment and
Listing show what it sent; heartbeats, their interval, and going offline."""

from __future__ import annotations

import asyncio
import os

from support.fake_nvml import h100_sxm, write_config
from support.renter import Renter
from support.waiting import until

from gpuhost_agent.local_marketplace.shapes import HARDWARE_FIELDS
from gpuhost_agent.service.daemon import stop_agent


async def _get(renter: Renter, path: str) -> dict:
    status, body = await renter.call("GET", path)
    assert status == 200, body
    return body


async def _env(renter: Renter) -> dict:
    return await _get(renter, f"/environments/{renter.store.envId}")


async def _ready(renter: Renter, timeout: float = 20) -> dict:
    async def ready():
        env = await _env(renter)
        return (
            env["initState"].get("state") == "ready" and (env.get("systemData") or {}).get("networkSpeed") is not None
        )

    await until(ready, timeout)
    return await _env(renter)


async def test_listing_shows_every_hardware_field_from_the_probe(gpu_agent) -> None:
    renter, parts, _local, _ = await gpu_agent()
    env = await _ready(renter)
    listing = await _get(renter, f"/environments/{renter.store.envId}/listing")
    assert listing == env["listing"]
    # The marketplace is on this machine: its speed test measured loopback, not published.
    missing = [key for key in HARDWARE_FIELDS if listing[key] is None]
    assert missing == ["networkUploadSpeed", "networkDownloadSpeed"]
    assert listing["totalGPUs"] == 8 and listing["availableGPUs"] == 8
    assert (listing["gpuName"], listing["gpuVRAM"], listing["gpuBandwidth"]) == ("NVIDIA H100 80GB HBM3", 80, 3352.3)
    assert (listing["gpuInterconnect"], listing["gpuCUDA"], listing["location"]) == (
        "NVLink",
        "12.4",
        "EU-DE-Frankfurt",
    )
    speed = env["systemData"]["networkSpeed"]
    assert (speed["uploadMbps"], speed["downloadMbps"]) == (None, None)
    assert speed["error"].startswith("not published: the marketplace is on this machine (127.0.0.1)")
    assert 0 < speed["bytesDown"] <= 2_000_000 and 0 < speed["bytesUp"] <= 2_000_000  # the transfer itself ran

    gpus = env["systemData"]["nvml"]["gpus"]
    assert len(gpus) == 8 and gpus[3]["pcie"]["genMax"] == 5 and gpus[3]["powerLimitW"] == 700.0
    checks = {check["id"]: check for check in env["systemData"]["complianceChecks"]}
    for passing in (
        "nvidia-gpu",
        "driver-version",
        "cuda-version",
        "gpu-models",
        "gpu-memory-errors",
        "gpu-containers",
        "compose",
    ):
        assert checks[passing]["ok"], checks[passing]
    failed = [check["summary"] for check in checks.values() if not check["ok"]]
    assert env["isCompliant"] is (not failed)
    assert env["failedComplianceReason"] == "; ".join(failed)
    # A rental takes GPUs off the available count.
    await renter.rental(gpu_count=3)
    assert (await _get(renter, f"/environments/{renter.store.envId}/listing"))["availableGPUs"] == 5


async def test_init_state_walks_every_phase_to_ready(gpu_agent) -> None:
    renter, _parts, _local, _ = await gpu_agent()
    init = (await _ready(renter))["initState"]
    assert init["state"] == "ready" and init["error"] is None
    assert [(p["name"], p["state"]) for p in init["phases"]] == [
        ("config", "done"),
        ("marketplace", "done"),
        ("docker", "done"),
        ("compose", "done"),
        ("hardware", "done"),
        ("compliance", "done"),
    ]
    assert all(p["startedAt"] and p["finishedAt"] for p in init["phases"][1:])
    assert init["phases"][4]["detail"].startswith("8 GPU(s)")


async def test_startup_blocked_by_docker_is_reported_and_resumes(gpu_agent, monkeypatch, tmp_path) -> None:
    engine_socket = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
    stopped = tmp_path / "stopped-docker.sock"  # no engine answers there until the host starts Docker
    monkeypatch.setenv("DOCKER_HOST", f"unix://{stopped}")
    renter, _parts, local, _ = await gpu_agent(heartbeat_seconds=0.3)

    async def stuck():
        init = (await _env(renter))["initState"]
        return init.get("state") == "failed" and init.get("phase") == "docker"

    await until(stuck, 10)
    env = await _env(renter)
    assert "Docker Engine unreachable" in env["initState"]["error"]
    assert "stopped-docker.sock" in env["initState"]["error"]

    async def beat_says_failed():  # alive while stuck, and seen so (the first beat may predate the failure)
        return local.state.beats_received > 0 and (await _env(renter))["heartbeat"]["initState"] == "failed"

    await until(beat_says_failed, 5)

    await asyncio.to_thread(stopped.symlink_to, engine_socket)  # the host starts Docker: its socket appears
    env = await _ready(renter, timeout=30)
    docker_phase = env["initState"]["phases"][2]
    assert docker_phase["state"] == "done" and docker_phase["detail"].startswith("Docker Engine ")


async def test_heartbeat_interval_set_by_the_marketplace_and_offline_detection(gpu_agent) -> None:
    renter, parts, local, _ = await gpu_agent(heartbeat_seconds=0.5)
    await _ready(renter)

    async def beat_since_ready() -> bool:
        """The init-state report can overtake the last beat, which then still says "starting"."""
        return ((await _env(renter))["heartbeat"] or {}).get("initState") == "ready"

    await until(beat_since_ready, 5)
    heartbeat = (await _env(renter))["heartbeat"]
    assert heartbeat["online"] is True and heartbeat["intervalSeconds"] == 0.5
    assert len(heartbeat["gpus"]) == 8 and heartbeat["gpus"][0]["temperatureC"] == 30
    assert heartbeat["host"]["memoryTotalBytes"] > 0 and heartbeat["initState"] == "ready"

    local.state.intervals["heartbeatSeconds"] = 0.15  # the marketplace wants beats more often
    await until(lambda: parts.host.intervals["heartbeatSeconds"] == 0.15, 5)
    before = local.state.beats_received
    await asyncio.sleep(1.2)
    assert local.state.beats_received - before >= 5  # at 0.5 s there would be 2 or 3

    task = next(t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "Agent.run")
    await stop_agent(parts, task)

    async def offline():
        return (await _env(renter))["heartbeat"]["online"] is False

    await until(offline, 5)
    heartbeat = (await _env(renter))["heartbeat"]
    assert heartbeat["missedBeats"] >= 3 and heartbeat["lastBeatAt"]


async def test_system_data_is_resent_on_change_not_on_every_probe(gpu_agent) -> None:
    renter, parts, local, nvml_config = await gpu_agent(heartbeat_seconds=5)
    await _ready(renter)
    await until(lambda: parts.outbox.pending() == 0, 5)
    sent = local.state.system_data_received
    await parts.host.refresh()
    await parts.host.refresh()
    await asyncio.sleep(0.2)
    assert local.state.system_data_received == sent  # nothing changed: nothing sent

    gpus = h100_sxm(8)
    gpus[7].ecc_uncorrected = 2
    await asyncio.to_thread(write_config, nvml_config, gpus)
    parts.nvml.close()  # NVML re-reads its state on the next init, as after a driver reload
    await parts.host.refresh()
    await until(lambda: local.state.system_data_received == sent + 1, 5)
    env = await _env(renter)
    assert env["isCompliant"] is False
    assert "uncorrected ECC memory errors on GPU 7" in env["failedComplianceReason"]


async def test_marketplace_that_lost_system_data_gets_it_again(gpu_agent) -> None:
    renter, _parts, local, _ = await gpu_agent(heartbeat_seconds=0.2)
    await _ready(renter)
    local.state.store.host.pop("report")
    assert (await _env(renter))["failedComplianceReason"] == "the agent has not reported this machine yet"

    async def restored():
        return bool((await _env(renter))["systemData"])

    await until(restored, 5)
    assert (await _get(renter, f"/environments/{renter.store.envId}/listing"))["totalGPUs"] == 8

    # Asked again within the systemData interval (as a marketplace refusing the
    # report would, at every beat): not resent until the interval has passed.
    local.state.store.host.pop("report")
    beats = local.state.beats_received
    await until(lambda: local.state.beats_received >= beats + 4, 5)
    assert not (await _env(renter))["systemData"]

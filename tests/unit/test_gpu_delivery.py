"""Which way GPUs reach containers: the probe's gpuDelivery from
recorded facts, and the sandbox's request for each way. Docker 26's `docker
info` lists CDISpecDirs only with `"features": {"cdi": true}` (Docker 28: on
by default); the spec is shaped as `nvidia-ctk cdi generate
--device-name-strategy=index --device-name-strategy=uuid` writes it. The same
on the real engine, without a hook: test_modern_host's CDI test."""

from __future__ import annotations

import asyncio

import pytest
from support.machine_samples import good_host
from support.settings import sandbox_for, stack_context

from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.sandbox.apply import decide, review_raw
from gpuhost_agent.core.sandbox.context import GIB, StackSite
from gpuhost_agent.core.sandbox.raw import RawReview
from gpuhost_agent.core.swarm.stack_file import SwarmPlacement, swarm_stack
from gpuhost_agent.inventory import gpu_delivery, host_probe, render
from gpuhost_agent.inventory.compliance import evaluate
from gpuhost_agent.inventory.gpu_delivery import DeliveryFacts
from gpuhost_agent.protocol import wire, wire_jobs
from gpuhost_agent.protocol.requirements import Requirements
from gpuhost_agent.storage.agent_db import AgentDB

UUIDS = ("GPU-3a1c0e1e-0000-4000-8000-000000000000", "GPU-3a1c0e1e-0000-4000-8000-000000000001")
SPEC = """---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes: [{path: /dev/nvidia0}]
- name: {u0}
  containerEdits:
    deviceNodes: [{path: /dev/nvidia0}]
- name: "1"
  containerEdits:
    deviceNodes: [{path: /dev/nvidia1}]
- name: {u1}
  containerEdits:
    deviceNodes: [{path: /dev/nvidia1}]
- name: all
  containerEdits:
    deviceNodes: [{path: /dev/nvidia0}, {path: /dev/nvidia1}]
containerEdits:
  deviceNodes: [{path: /dev/nvidiactl}]
""".replace("{u0}", UUIDS[0]).replace("{u1}", UUIDS[1])
INDEX_ONLY = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n- name: all\n"
HOOK = "/usr/bin/nvidia-container-runtime-hook"
DIRS = ("/etc/cdi", "/var/run/cdi")  # Docker 26's /info with the feature on


def _specs(tmp_path, **files: str) -> tuple[str, ...]:
    folder = tmp_path / "cdi"
    folder.mkdir()
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text)
    return (str(folder),)


def test_cdi_when_the_feature_is_on_and_a_spec_names_the_gpus_by_uuid(tmp_path) -> None:
    dirs = _specs(tmp_path, nvidia_yaml=SPEC, other_json='{"kind": "vendor.com/nic", "devices": [{"name": "0"}]}')
    specs = gpu_delivery.read_specs(dirs)
    assert [(s.kind, len(s.names)) for s in specs] == [("nvidia.com/gpu", 5), ("vendor.com/nic", 1)]
    found = gpu_delivery.decide(DeliveryFacts(cdi_spec_dirs=dirs, specs=specs))
    assert found == {
        "method": "cdi",
        "detail": f"dockerd's CDI feature on; {dirs[0]}/nvidia.yaml names 2 GPU(s) by UUID (nvidia.com/gpu=GPU-…)",
    }


def test_cdi_wins_over_the_hook_and_the_detail_says_both(tmp_path) -> None:
    dirs = _specs(tmp_path, nvidia_yaml=SPEC)
    facts = DeliveryFacts(cdi_spec_dirs=dirs, specs=gpu_delivery.read_specs(dirs), hook=HOOK, runtimes=("nvidia",))
    found = gpu_delivery.decide(facts)
    assert found["method"] == "cdi"
    assert found["detail"].endswith(
        f"; nvidia-container-runtime-hook at {HOOK}, nvidia runtime registered too, not used: CDI wins"
    )


def test_the_hook_when_the_cdi_feature_is_off_even_with_a_spec(tmp_path) -> None:
    specs = gpu_delivery.read_specs(_specs(tmp_path, nvidia_yaml=SPEC))  # on disk, but dockerd does not read it
    found = gpu_delivery.decide(DeliveryFacts(cdi_spec_dirs=(), specs=specs, hook=HOOK))
    assert found == {
        "method": "runtime-hook",
        "detail": f"nvidia-container-runtime-hook at {HOOK} "
        '(CDI: dockerd\'s CDI feature is off ("features": {"cdi": true} in daemon.json turns it on))',
    }


def test_a_spec_with_index_names_only_is_not_used_and_the_fix_is_named(tmp_path) -> None:
    dirs = _specs(tmp_path, nvidia_yaml=INDEX_ONLY)
    found = gpu_delivery.decide(DeliveryFacts(cdi_spec_dirs=dirs, specs=gpu_delivery.read_specs(dirs)))
    assert found["method"] == "none"
    assert "names GPUs by index only" in found["detail"]
    assert "--device-name-strategy=uuid" in found["detail"]


def test_none_without_either_and_unreadable_specs_are_said(tmp_path) -> None:
    dirs = _specs(tmp_path, broken_yaml="kind: [unclosed\n", list_yaml="- a\n")
    big = tmp_path / "cdi" / "big.yaml"
    with big.open("wb") as file:
        file.truncate(gpu_delivery.MAX_SPEC_BYTES + 1)
    specs = gpu_delivery.read_specs((*dirs, str(tmp_path / "absent")))
    assert [s.error.split(":")[0] for s in specs] == ["larger than 4 MiB, not read", "not a CDI spec", "not a CDI spec"]
    found = gpu_delivery.decide(DeliveryFacts(cdi_spec_dirs=dirs, specs=specs))
    assert found["method"] == "none"
    assert found["detail"].startswith("no nvidia-container-runtime-hook or nvidia runtime; CDI: no spec of kind")
    assert "big.yaml: larger than 4 MiB" in found["detail"]


def test_the_probe_reads_dockerds_own_folders(tmp_path, monkeypatch) -> None:
    """host_probe.delivery: the folders /info names, the hook where dockerd would find it."""
    dirs = _specs(tmp_path, nvidia_yaml=SPEC)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(host_probe.toolkit, "find_binaries", lambda: {})
    assert host_probe.delivery({"cdiSpecDirs": list(dirs), "runtimes": ["runc"]})["method"] == "cdi"
    assert host_probe.delivery({"cdiSpecDirs": [], "runtimes": ["runc"]})["method"] == "none"
    assert host_probe.delivery({"cdiSpecDirs": [], "runtimes": ["nvidia", "runc"]})["method"] == "runtime-hook"


def test_probe_and_doctor_say_the_way() -> None:
    data = good_host()
    docker = data["host"]["docker"]
    docker["gpuDelivery"] = {"method": "cdi", "detail": "dockerd's CDI feature on; ..."}
    (check,) = [c for c in evaluate(data, Requirements()) if c.id == "gpu-containers"]
    assert check.ok and check.summary.endswith("; GPUs reach them through cdi: dockerd's CDI feature on; ...")
    # A CDI spec is a sign for gpuContainers, but one dockerd does not read gives no way in.
    docker["gpuContainers"] = {"ok": True, "method": "engine-info", "detail": "NVIDIA CDI spec in /etc/cdi"}
    docker["gpuDelivery"] = {"method": "none", "detail": "no ...; CDI: dockerd's CDI feature is off (...)"}
    (check,) = [c for c in evaluate(data, Requirements()) if c.id == "gpu-containers"]
    assert not check.ok and "dockerd's CDI feature is off" in check.summary


def test_a_host_without_the_toolkit_whose_gpus_reach_containers_by_cdi_is_compliant() -> None:
    """The agent's own spec needs no toolkit, and no hook is better. doctor passes the toolkit
    as not needed and GPU containers by the spec it names; without CDI the missing toolkit still fails."""
    data = good_host()
    data["host"]["nvidiaContainerToolkit"] = {"installed": False, "version": None, "binaries": []}
    docker = data["host"]["docker"]
    docker["gpuContainers"] = {"ok": False, "method": "engine-info", "detail": "no nvidia runtime, CDI spec or hook"}
    spec = "/etc/cdi/gpuhost-nvidia.yaml"
    docker["gpuDelivery"] = {"method": "cdi", "detail": f"dockerd's CDI feature on; {spec} names 2 GPU(s) by UUID"}
    checks = {c.id: c for c in evaluate(data, Requirements())}
    assert checks["container-toolkit"].ok and "not needed" in checks["container-toolkit"].summary
    assert spec in checks["container-toolkit"].summary
    assert checks["gpu-containers"].ok and not checks["gpu-containers"].skipped
    assert spec in checks["gpu-containers"].summary
    assert checks["toolkit-visible-devices"].skipped
    # A check container that failed rules over the spec's promise.
    docker["gpuContainers"] = {"ok": False, "method": "container", "detail": "could not select device driver"}
    checks = {c.id: c for c in evaluate(data, Requirements())}
    assert not checks["gpu-containers"].ok and "could not select device driver" in checks["gpu-containers"].summary
    # An nvidia runtime registered in Docker is a toolkit the agent did not find (the GPU
    # Operator's /usr/local/nvidia/toolkit): its version cannot be checked, so it fails whatever CDI does.
    docker["runtimes"] = ["io.containerd.runc.v2", "nvidia", "runc"]
    checks = {c.id: c for c in evaluate(data, Requirements())}
    toolkit = checks["container-toolkit"]
    assert not toolkit.ok and "an nvidia runtime is registered" in toolkit.summary
    docker["runtimes"] = ["io.containerd.runc.v2", "runc"]
    # Without CDI, no toolkit is still a failure, and the GPU check waits for it.
    docker["gpuDelivery"] = {"method": "none", "detail": "no hook; CDI: dockerd's CDI feature is off"}
    docker["gpuContainers"] = {"ok": False, "method": "engine-info", "detail": "nothing"}
    checks = {c.id: c for c in evaluate(data, Requirements())}
    assert not checks["container-toolkit"].ok and checks["gpu-containers"].skipped


def test_the_probe_table_has_a_row_for_it() -> None:
    assert render._delivery({"method": "cdi", "detail": "x"}) == "cdi: x"
    assert render._delivery({}) == "unknown"
    spec = {"path": "/etc/cdi/gpuhost-nvidia.yaml", "detail": "in place for 1 GPU(s), driver 570.86.10"}
    assert render._agent_spec(spec) == "/etc/cdi/gpuhost-nvidia.yaml, in place for 1 GPU(s), driver 570.86.10"
    assert render._agent_spec({"path": None, "detail": "no spec written: no /dev/nvidiactl"}) == (
        "no spec written: no /dev/nvidiactl"
    )


# ---- the sandbox: the rental's GPUs through CDI, whatever the renter spelled ----------------

CDI_CTX = stack_context(project="p", gpu_uuids=UUIDS, cpus=8.0, memory_bytes=8 * GIB, gpu_delivery="cdi")
HOOK_CTX = stack_context(project="p", gpu_uuids=UUIDS, cpus=8.0, memory_bytes=8 * GIB)
SPELLINGS = {
    "gpus all": {"gpus": [{"count": -1}]},  # Compose's normalised model, as the sandbox reads it
    "count 1": {"deploy": {"resources": {"reservations": {"devices": [{"driver": "nvidia", "count": 1}]}}}},
    "runtime": {"runtime": "nvidia"},
    "variable": {"environment": {"NVIDIA_VISIBLE_DEVICES": "1"}},
    "cdi index": {"devices": [{"source": "nvidia.com/gpu=0", "target": "nvidia.com/gpu=0", "permissions": "rwm"}]},
    "cdi all": {
        "deploy": {
            "resources": {
                "reservations": {
                    "devices": [{"driver": "cdi", "device_ids": ["nvidia.com/gpu=all"], "capabilities": ["gpu"]}]
                }
            }
        }
    },
    "node": {"devices": ["/dev/nvidia1"]},
}
EXPECTED = {"gpus all": UUIDS, "count 1": UUIDS[:1], "runtime": UUIDS, "variable": UUIDS[1:], "cdi index": UUIDS[:1]}
EXPECTED |= {"cdi all": UUIDS, "node": UUIDS[1:]}


def _hardened(service: dict, ctx) -> dict:
    model = {"services": {"gpu": {"image": "x", **service}, "plain": {"image": "x"}}}
    return decide(model, RawReview(""), ctx)[0]["services"]


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_with_cdi_each_gpu_service_asks_cdi_for_the_rentals_uuids(spelling) -> None:
    services = _hardened(SPELLINGS[spelling], CDI_CTX)
    gpu, plain = services["gpu"], services["plain"]
    (request,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert request["driver"] == "cdi"
    assert request["device_ids"] == [f"nvidia.com/gpu={uuid}" for uuid in EXPECTED[spelling]]
    assert "gpu" in request["capabilities"]  # Compose 2.26 requires the key; dockerd ignores it for cdi
    assert gpu["environment"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(EXPECTED[spelling])
    assert "reservations" not in (plain.get("deploy") or {}).get("resources", {})
    assert plain["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    hooked = _hardened(SPELLINGS[spelling], HOOK_CTX)["gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert hooked == [{**request, "driver": "nvidia", "device_ids": list(EXPECTED[spelling])}]


def test_swarm_has_no_device_requests_and_keeps_the_variable() -> None:
    """A Swarm service has no device requests: the rewrite drops the
    reservation whichever way it was written, and the node's GPUs come from
    NVIDIA_VISIBLE_DEVICES, which only the hook reads (docs/hosts.md)."""
    placed = SwarmPlacement(gpu_nodes=dict.fromkeys(UUIDS, "n1"), home_node="n1")
    hardened = decide({"services": {"gpu": {"image": "x", "gpus": [{"count": -1}]}}}, RawReview(""), CDI_CTX)[0]
    stack, _ = swarm_stack(hardened, CDI_CTX, placed)
    service = stack["services"]["gpu"]
    assert "reservations" not in service["deploy"]["resources"]
    assert service["environment"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(UUIDS)


@pytest.mark.parametrize("method, driver", [("cdi", "cdi"), ("runtime-hook", "nvidia"), (None, "nvidia")])
async def test_the_sandbox_takes_the_way_from_the_probe(tmp_path, method, driver) -> None:
    facts = good_host()
    if method:
        facts["host"]["docker"]["gpuDelivery"] = {"method": method, "detail": "..."}
    else:
        facts["host"]["docker"].pop("gpuDelivery")  # an older report: the hook, as before

    async def machine() -> dict:
        return facts

    ledger = GpuLedger(await asyncio.to_thread(AgentDB, tmp_path / "agent.db"))
    sandbox = sandbox_for(ledger, machine)
    text = "services:\n  a:\n    image: busybox\n    gpus: all\n"
    job = wire_jobs.StackJob("job-1", wire.JOB_DEPLOY, "stack-1", "rental-1", "env-1", "s", {"content": text}, 1)
    model = {"name": "p", "services": {"a": {"image": "busybox", "gpus": [{"count": -1, "capabilities": ["gpu"]}]}}}
    hardened, uuids, _ = await sandbox.apply(job, model, review_raw(text), StackSite(project="p"))
    (request,) = hardened["services"]["a"]["deploy"]["resources"]["reservations"]["devices"]
    assert request["driver"] == driver
    assert request["device_ids"] == [f"nvidia.com/gpu={uuids[0]}" if driver == "cdi" else uuids[0]]

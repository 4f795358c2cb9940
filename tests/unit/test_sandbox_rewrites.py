"""The sandbox's changes for published files, one at a time, through
the real Compose CLI: each of these failed on the agent before the rewrites."""

from __future__ import annotations

import asyncio

import pytest
from support.machine_samples import good_host
from support.sandbox_decide import RENTAL_GPUS, decide_file
from support.settings import sandbox_for

from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.sandbox.apply import review_raw
from gpuhost_agent.core.sandbox.context import StackSite
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.core.swarm.placement import SwarmPlacer
from gpuhost_agent.protocol import wire, wire_jobs
from gpuhost_agent.runtime.compose import ComposeRunner, find_compose_command
from gpuhost_agent.storage.agent_db import AgentDB

MERGE_THEN_OVERRIDE = """
x-defaults: &defaults
  image: busybox
  environment:
    FROM_DEFAULTS: "1"
services:
  app:
    <<: *defaults
    environment:
      WRITTEN: "2"
"""


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> ComposeRunner:
    return ComposeRunner(find_compose_command(), tmp_path_factory.mktemp("docker-config"))


async def test_a_merge_key_overridden_by_a_later_key_is_standard_yaml(compose, tmp_path) -> None:
    problems, hardened, _ = await decide_file(compose, MERGE_THEN_OVERRIDE, tmp_path / "stacks" / "s")
    assert problems == []
    environment = hardened["services"]["app"]["environment"]
    assert environment["WRITTEN"] == "2" and "FROM_DEFAULTS" not in environment  # the written key wins


async def test_a_key_written_twice_is_still_refused(compose, tmp_path) -> None:
    text = "services:\n  app:\n    image: busybox\n    image: other\n"
    problems, _, _ = await decide_file(compose, text, tmp_path / "stacks" / "s")
    assert problems and "duplicate key 'image'" in problems[0]


async def test_annotations_are_refused_naming_the_key(compose, tmp_path) -> None:
    text = "services:\n  app:\n    image: busybox\n    annotations:\n      cdi.k8s.io/gpu: nvidia.com/gpu=all\n"
    problems, _, _ = await decide_file(compose, text, tmp_path / "stacks" / "s")
    assert problems and 'service "app": annotations is not allowed' in problems[0]


async def test_every_gpu_form_becomes_the_rentals_gpus(compose, tmp_path) -> None:
    text = """
services:
  runtime:
    image: busybox
    runtime: nvidia
  variable:
    image: busybox
    environment: [NVIDIA_VISIBLE_DEVICES=all, NVIDIA_API_KEY=nvapi-x, NVIDIA_DRIVER_CAPABILITIES=compute,utility]
  cdi:
    image: busybox
    devices: [nvidia.com/gpu=all]
  node:
    image: busybox
    devices: [/dev/nvidia1, /dev/nvidiactl, /dev/nvidia-uvm]
  capabilities:
    image: busybox
    deploy: {resources: {reservations: {devices: [{driver: nvidia, count: 1, capabilities: [compute, utility]}]}}}
"""
    problems, hardened, notices = await decide_file(compose, text, tmp_path / "stacks" / "s")
    assert problems == [], problems
    visible = {name: s["environment"]["NVIDIA_VISIBLE_DEVICES"] for name, s in hardened["services"].items()}
    everything = ",".join(RENTAL_GPUS)
    assert visible == {
        "runtime": everything,
        "variable": everything,
        "cdi": everything,
        "node": RENTAL_GPUS[1],
        "capabilities": RENTAL_GPUS[0],
    }
    assert hardened["services"]["variable"]["environment"]["NVIDIA_API_KEY"] == "nvapi-x"  # the application's
    named = {notice.split('"')[1] for notice in notices}
    assert named == {"runtime", "variable", "cdi", "node"}, notices


async def test_a_gpu_beyond_the_rental_is_refused_with_its_count(compose, tmp_path) -> None:
    text = "services:\n  app:\n    image: busybox\n    environment: ['NVIDIA_VISIBLE_DEVICES=0,2']\n"
    problems, _, _ = await decide_file(compose, text, tmp_path / "stacks" / "s")
    assert problems and "GPU '2' is not one of the rental's 2 GPU(s) (use 0 to 1)" in problems[0]
    assert "NVIDIA_VISIBLE_DEVICES" in problems[0]


async def test_binds_beside_the_file_and_in_home_become_named_volumes(compose, tmp_path) -> None:
    text = (
        "services:\n  app:\n    image: busybox\n    volumes:\n"
        "      - ./data:/data\n      - ~/.cache/huggingface:/root/.cache/huggingface:ro\n"
        "      - /etc/localtime:/etc/localtime:ro\n      - /var/run/docker.sock:/x\n"
    )
    problems, _, _ = await decide_file(compose, text, tmp_path / "stacks" / "s")
    assert len(problems) == 1 and "bind mount of the host path '/var/run/docker.sock'" in problems[0]
    assert str(tmp_path) not in problems[0]
    text = text.replace("      - /var/run/docker.sock:/x\n", "")
    problems, hardened, notices = await decide_file(compose, text, tmp_path / "b")
    assert problems == []
    mounts = hardened["services"]["app"]["volumes"]
    assert [(m["type"], m["source"], m["target"]) for m in mounts] == [
        ("volume", "bind_data", "/data"),
        ("volume", "home_.cache_huggingface", "/root/.cache/huggingface"),
    ]
    assert mounts[1]["read_only"] is True
    assert any("/etc/localtime dropped" in notice for notice in notices)


async def test_services_all_behind_profiles_are_refused_before_any_gpu_is_taken(tmp_path) -> None:
    text = (
        "services:\n  gpu:\n    image: busybox\n    profiles: [cuda]\n"
        "    deploy: {resources: {reservations: {devices: [{driver: nvidia, count: all, capabilities: [gpu]}]}}}\n"
    )
    ledger = GpuLedger(await asyncio.to_thread(AgentDB, tmp_path / "agent.db"))

    async def facts() -> dict:
        return good_host()

    sandbox = sandbox_for(ledger, facts)
    raw = review_raw(text)
    job = wire_jobs.StackJob(
        "job-1", wire.JOB_DEPLOY, "stack-1", "rental-1", "env-1", "s", {"content": text}, gpu_count=2
    )
    with pytest.raises(StackRejected, match="COMPOSE_PROFILES to the profiles to start \\(cuda, or \\*\\)"):
        await sandbox.apply(job, {"name": "p", "services": {}}, raw, StackSite(project="p"))
    assert ledger.assignments == {}  # nothing committed for a refused stack
    assert review_raw(text, "cuda").problems == []


def test_env_file_named_from_the_file_is_dropped_and_host_files_refused() -> None:
    """`../../.env` (a project's tree) is dropped like `./.env`:
    Compose reads neither; a host path, `~` or a variable stays refused."""
    raw = review_raw(
        "services:\n  app:\n    image: busybox\n    env_file: [.env, /etc/shadow, ../../.env, '~/.env', '${X}/a.env']\n"
    )
    assert "env_file" not in raw.text and ".env" not in raw.text
    assert [n for n in raw.notices if "'.env' dropped" in n] and [n for n in raw.notices if "'../../.env' dropped" in n]
    assert len(raw.problems) == 3 and "'/etc/shadow'" in raw.problems[0] and "'~/.env'" in raw.problems[1]


def test_plain_scalars_keep_their_text_when_the_file_is_rewritten() -> None:
    raw = review_raw(
        "services:\n  app:\n    image: busybox\n    build: .\n    environment:\n      A: yes\n      B: 0755\n"
    )
    assert "A: yes" in raw.text and "B: 0755" in raw.text and "build" not in raw.text


async def test_container_name_is_dropped_and_kept_as_an_alias(compose, tmp_path) -> None:
    text = """
services:
  ollama-gpu:
    image: busybox
    container_name: ollama
    networks: [demo]
  webui:
    image: busybox
    container_name: webui
  alone:
    image: busybox
    container_name: alone
    network_mode: none
networks:
  demo: {}
"""
    problems, hardened, notices = await decide_file(compose, text, tmp_path / "stacks" / "s")
    assert problems == []
    services = hardened["services"]
    assert all("container_name" not in service for service in services.values())
    assert services["ollama-gpu"]["networks"] == {"demo": {"aliases": ["ollama"]}}
    assert services["webui"]["networks"] == {"default": {"aliases": ["webui"]}}
    assert "networks" not in services["alone"]
    assert sum("container_name" in notice for notice in notices) == 3
    assert "service \"ollama-gpu\": container_name 'ollama' dropped" in "\n".join(notices)


def test_encrypted_overlays_are_asked_for_in_the_configuration() -> None:
    from gpuhost_agent.service import config as config_module

    assert config_module.load({}, environ={"GPUHOST_SWARM_ENCRYPTED": "on"}).swarm_encrypted is True
    assert config_module.load({}, environ={}).swarm_encrypted is False
    with pytest.raises(config_module.ConfigError, match="GPUHOST_SWARM_ENCRYPTED must be on or off"):
        config_module.load({}, environ={"GPUHOST_SWARM_ENCRYPTED": "maybe"})


@pytest.mark.parametrize("encrypted", [True, False])
async def test_a_swarm_stack_s_overlays_are_encrypted_when_the_host_asks(tmp_path, encrypted) -> None:
    """GPUHOST_SWARM_ENCRYPTED reaches the Swarm rewrite through the sandbox
    (the rewrite's own output for it: test_swarm_rewrite.py)."""
    ledger = GpuLedger(await asyncio.to_thread(AgentDB, tmp_path / "agent.db"))

    async def facts() -> dict:
        host = good_host()
        host["host"]["docker"]["swarm"] = {"state": "active", "nodeId": "node-1", "manager": True, "nodes": 1}
        return host

    async def peers(rental_id: str, project: str) -> dict[str, int]:
        return {}

    sandbox = sandbox_for(ledger, facts, placement=SwarmPlacer(peers, encrypted=encrypted))
    text = "services:\n  app:\n    image: busybox\n"
    model = {
        "name": "p",
        "services": {"app": {"image": "busybox", "networks": {"default": None}}},
        "networks": {"default": {"name": "p_default"}},
    }
    job = wire_jobs.StackJob("job-1", wire.JOB_DEPLOY, "stack-1", "rental-1", "env-1", "s", {"content": text})
    hardened, _, _ = await sandbox.apply(job, model, review_raw(text), StackSite(project="p"))
    (network,) = hardened["networks"].values()
    assert network["driver"] == "overlay" and ("driver_opts" in network) is encrypted, network
    if encrypted:
        assert network["driver_opts"] == {"encrypted": ""}

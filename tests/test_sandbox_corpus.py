"""The sandbox policy against the corpus in tests/sandbox_corpus/ (its README
says what each file tries or shows).

First the decision alone, on Compose's real normalised model (the real Compose
CLI, no engine): every hostile file is refused naming its service and key,
every legitimate one passes. Then end to end through the local marketplace and
the agent on the real engine: every hostile file ends in ERROR with no
container created, every legitimate file deploys.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from conftest import TEST_IMAGE
from gpuhost_agent.protocol import wire
from gpuhost_agent.core.compose_rewrite import StackRejected
from gpuhost_agent.core.sandbox import refuse_raw
from gpuhost_agent.core.sandbox_context import GIB, SandboxContext
from gpuhost_agent.core.sandbox_harden import harden
from gpuhost_agent.core.sandbox_policy import policy_violations
from gpuhost_agent.runtime.compose import ComposeError, ComposeRunner, find_compose_command

CORPUS = Path(__file__).parent / "sandbox_corpus"
HOSTILE = sorted((CORPUS / "hostile").glob("*.yaml"))
LEGIT = sorted((CORPUS / "legit").glob("*.yaml"))
RENTAL_GPUS = ("GPU-11111111-1111-1111-1111-111111111111", "GPU-22222222-2222-2222-2222-222222222222")


def header(path: Path) -> dict:
    fields = {}
    for line in path.read_text().splitlines():
        match = re.match(r"#\s*([a-z-]+):\s*(.*)", line)
        if not match:
            break
        fields[match.group(1)] = match.group(2).strip()
    return fields


def test_the_corpus_is_big_enough_and_documented() -> None:
    assert len(HOSTILE) >= 40 and len(LEGIT) >= 8
    for path in HOSTILE:
        assert {"tries", "service", "expect"} <= set(header(path)), path.name
    for path in LEGIT:
        assert "shows" in header(path), path.name
    readme = (CORPUS / "README.md").read_text()
    assert all(path.name in readme for path in HOSTILE + LEGIT)


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> ComposeRunner:
    return ComposeRunner(find_compose_command(), tmp_path_factory.mktemp("docker-config"))


async def _decide(compose: ComposeRunner, path: Path, workdir: Path) -> tuple[list[str], dict | None]:
    """The refusals the agent would give (raw check, Compose's own errors, the policy)."""
    text = path.read_text()
    try:
        refuse_raw(text)
    except StackRejected as exc:
        return [str(exc)], None
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "compose.yaml").write_text(text)
    try:
        model = await compose.config("corpus", workdir, "compose.yaml", {})
    except ComposeError as exc:
        return [f"invalid Compose file: {exc}"], None
    ctx = SandboxContext(project="corpus", gpu_uuids=RENTAL_GPUS, cpus=4.0, memory_bytes=8 * GIB)
    return policy_violations(model, ctx), harden(model, ctx)


@pytest.mark.parametrize("path", HOSTILE, ids=[p.stem for p in HOSTILE])
async def test_hostile_file_is_refused_naming_service_and_key(compose, path, tmp_path) -> None:
    problems, _ = await _decide(compose, path, tmp_path)
    expected = header(path)
    named = [text for text in problems if expected["expect"] in text]
    assert named, f"{path.name}: {expected['tries']}: got {problems}"
    if expected["service"] != "-":
        assert any(f'"{expected["service"]}"' in text for text in named) or "extends" in expected["expect"], named


@pytest.mark.parametrize("path", LEGIT, ids=[p.stem for p in LEGIT])
async def test_legitimate_file_passes_and_is_hardened(compose, path, tmp_path) -> None:
    problems, hardened = await _decide(compose, path, tmp_path)
    assert problems == [], problems
    wanted = json.loads(header(path).get("expect-gpus", "{}").replace("{", '{"').replace(": ", '": ')) \
        if header(path).get("expect-gpus") else {}
    for name, service in hardened["services"].items():
        assert service["security_opt"] == ["no-new-privileges:true"] and "NET_RAW" in service["cap_drop"]
        assert int(service["mem_limit"]) <= 8 * GIB and service["cpus"] <= 4.0 and service["pids_limit"] <= 4096
        visible = service["environment"]["NVIDIA_VISIBLE_DEVICES"]
        assert visible == (",".join(RENTAL_GPUS[: wanted[name]]) if name in wanted else "void"), name


async def test_every_hostile_file_ends_in_error_with_no_container(gpu_agent, docker_client) -> None:
    renter, _parts, _local, _ = await gpu_agent(gpus=2)
    rental = await renter.rental(gpu_count=2)
    stacks = {path: await renter.stack(rental, path.read_text(), name=path.stem) for path in HOSTILE}
    results = await asyncio.gather(*(renter.wait_stack(rental, stack_id, (wire.APPLIED, wire.ERROR), timeout=120)
                                     for stack_id in stacks.values()))
    for (path, stack_id), stack in zip(stacks.items(), results):
        assert stack["status"] == wire.ERROR and stack["errorMsg"], path.name
        assert header(path)["expect"] in stack["errorMsg"], (path.name, stack["errorMsg"])
    created = docker_client.containers.list(all=True, filters={"label": f"{wire.LABEL_RENTAL}={rental}"})
    assert created == []


async def test_every_legitimate_file_deploys(gpu_agent, docker_client) -> None:
    renter, _parts, _local, _ = await gpu_agent(gpus=4)
    for path in LEGIT:
        rental = await renter.rental(gpu_count=int(header(path).get("gpus", 0)))
        stack_id = await renter.stack(rental, path.read_text(), name=path.stem)
        stack = await renter.wait_stack(rental, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
        assert stack["status"] == wire.APPLIED, (path.name, stack["errorMsg"])
        for container in docker_client.containers.list(filters={"label": f"{wire.LABEL_STACK}={stack_id}"}):
            host_config = container.attrs["HostConfig"]
            assert host_config["Privileged"] is False and "no-new-privileges:true" in host_config["SecurityOpt"]
            assert host_config["Memory"] > 0 and host_config["NanoCpus"] > 0 and host_config["PidsLimit"] > 0
            assert {"MKNOD", "NET_RAW", "SYS_ADMIN"} <= {cap.removeprefix("CAP_") for cap in host_config["CapDrop"]}
            assert not host_config.get("CapAdd")
            for bindings in (host_config.get("PortBindings") or {}).values():
                assert all(binding["HostIp"] == "127.0.0.1" for binding in bindings)
        assert TEST_IMAGE.split(":")[0] in path.read_text()
        status, _ = await renter.call("DELETE", f"/rentals/{rental}")
        assert status == 200

"""Hostile Compose files from a generator (support/hostile_compose.py), judged
by the agent's sandbox: a refusal is a pass; a file the sandbox lets
through must give containers that keep every sandbox invariant.

- The decision alone, on many files: the raw pass, the real Compose CLI's
  normalisation, the rewrites and the policy (support/sandbox_decide.py, as the
  deployer makes it). A hardened model that breaks an invariant, or holds the
  host's planted secret, fails with the file (minimised by Hypothesis).
- Through the real agent on the real engine, on fewer files: each example is a
  batch of files deployed as stacks of one rental, every container they made is
  checked with `docker inspect` (support/sandbox_corpus.py's invariants, the
  agent's labels, the rental's GPUs) and a running one's files are searched for
  the secret.

The host's secret is planted twice: a fake agent.conf in a temporary folder
(the files name it in env_file, label_file, extends, include, secrets,
configs, binds, build contexts) and a variable of the agent's own environment
(`${...}` in the file, configs and secrets from the environment).

CI runs a fixed slice (a fixed seed: 100 files judged, 8 deployed, about 30 s).
`make fuzz` runs a longer, random one: GPUHOST_FUZZ_EXAMPLES sets the number of
files judged (the deployed batches are a tenth of it), GPUHOST_FUZZ_SEED a seed.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import tempfile
import time
from pathlib import Path

import docker.errors
import pytest
from hypothesis import HealthCheck, Phase, given, reject, seed, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from support.hostile_compose import FOREIGN_GPU, Hostile, Planted, hostile_file
from support.sandbox_corpus import assert_container_sandboxed
from support.sandbox_decide import FOREIGN, assert_sandboxed, decide_file

from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.compose import ComposeRunner, find_compose_command

# No example database, and Hypothesis's caches in the temporary directory: the checkout stays clean.
if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "gpuhost-agent-hypothesis")
HOST_VARIABLE = "GPUHOST_FUZZ_HOST_SECRET"
LONG = int(os.environ.get("GPUHOST_FUZZ_EXAMPLES", "0"))
JUDGED = LONG or 100
DEPLOYED = max(8, LONG // 10)
# CI's slice: a fixed seed, the same files every run. Seeded so, the slice finds both escapes of
# 843d536 it can reach (`!!binary ZW52X2ZpbGU=: <agent.conf>`, and a `!!set` key that crashed the
# raw pass instead of a refusal); `make fuzz` draws a new seed each run.
CI_SEED = 3
RENTAL_GPUS = 2


def _settings(examples: int, *, shrink: bool = True) -> settings:
    return settings(
        max_examples=examples,
        # Without shrinking, a failing deploy is reported at once, as generated (each step of shrinking is a
        # deploy). No explain phase: its tracer's file look-ups are blocking calls on the agent's event loop.
        phases=(Phase.explicit, Phase.reuse, Phase.generate, *((Phase.shrink,) if shrink else ())),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


def _seeded(test):
    chosen = os.environ.get("GPUHOST_FUZZ_SEED") or ("" if LONG else str(CI_SEED))
    return seed(int(chosen))(test) if chosen else test


@pytest.fixture
def planted(tmp_path, monkeypatch) -> Planted:
    secret = f"fuzz-secret-{secrets.token_hex(8)}"
    conf = tmp_path / "host-etc" / "agent.conf"
    conf.parent.mkdir()
    conf.write_text(f"GPUHOST_API_KEY={secret}\nGPUHOST_SWARM_KEY={secret}\n")
    monkeypatch.setenv(HOST_VARIABLE, secret)
    return Planted(secret, str(conf), HOST_VARIABLE)


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> ComposeRunner:
    return ComposeRunner(find_compose_command(), tmp_path_factory.mktemp("docker-config"))


def test_generated_files_are_refused_or_hardened(compose, planted, tmp_path) -> None:
    judged = {"refused": 0, "hardened": 0}

    @_seeded
    @_settings(JUDGED)
    @given(st.data())
    def judge(data) -> None:
        hostile = data.draw(hostile_file(planted))
        workdir = tmp_path / "stacks" / f"s{sum(judged.values())}"
        problems, hardened, _ = asyncio.run(decide_file(compose, hostile.text, workdir, FOREIGN, hostile.variables))
        judged["refused" if problems else "hardened"] += 1
        if hardened is None:
            return
        try:
            assert_sandboxed(hardened)
        except AssertionError as exc:
            raise AssertionError(f"the sandbox let through: {exc}\n{hostile.report()}") from None
        assert planted.secret not in json.dumps(hardened), f"the host's secret is in the model\n{hostile.report()}"
        assert FOREIGN_GPU not in json.dumps(hardened), f"a GPU of no rental is in the model\n{hostile.report()}"

    judge()
    assert judged["refused"] and judged["hardened"], judged  # the generator reaches both outcomes


async def test_deployed_files_keep_every_invariant(gpu_agent, planted, compose, docker_client, tmp_path) -> None:
    """Files the sandbox lets through (and a few it refuses, to see the agent
    refuse them too), each deployed as a stack of a fresh rental."""
    renter, _parts, _local, _ = await gpu_agent(gpus=8)
    loop = asyncio.get_running_loop()
    seen = {"deployed": 0, "applied": 0}

    async def deploy(hostile: Hostile) -> list[str]:
        rental = await renter.rental(gpu_count=RENTAL_GPUS)
        try:
            stack_id = await renter.stack(rental, hostile.text, hostile.variables, name="fuzz")
            stack = await renter.wait_stack(rental, stack_id, (wire.APPLIED, wire.ERROR), timeout=120)
            if stack["status"] != wire.APPLIED:
                return []
            seen["applied"] += 1
            return await asyncio.to_thread(_check_stack, docker_client, planted, hostile, rental, stack_id)
        finally:
            status, _ = await renter.call("DELETE", f"/rentals/{rental}")
            assert status == 200
            await asyncio.to_thread(_until_gone, docker_client, rental)

    @_seeded
    @_settings(DEPLOYED, shrink=bool(LONG))
    @given(st.data())
    def one(data) -> None:
        hostile = data.draw(hostile_file(planted, deployable=True))
        workdir = tmp_path / "judged" / f"s{seen['deployed']}-{secrets.token_hex(4)}"
        problems, _hardened, _ = asyncio.run(decide_file(compose, hostile.text, workdir, FOREIGN, hostile.variables))
        if problems and data.draw(st.integers(0, 3), label="also deploy a refused file") != 0:
            reject()
        seen["deployed"] += 1
        failures = asyncio.run_coroutine_threadsafe(deploy(hostile), loop).result()
        assert not failures, "\n\n".join(failures)

    await asyncio.to_thread(one)
    assert seen["applied"], f"no generated file was deployed: the slice checks nothing ({seen})"


def _until_gone(client, rental_id: str) -> None:
    """The rental's containers are removed (its GPUs free again) before the next file."""
    for _ in range(300):
        if not client.api.containers(all=True, quiet=True, filters={"label": f"{wire.LABEL_RENTAL}={rental_id}"}):
            return
        time.sleep(0.2)


def _check_stack(client, planted: Planted, hostile: Hostile, rental_id: str, stack_id: str) -> list[str]:
    """Every container of the stack against the sandbox's invariants: what went wrong, or nothing."""
    problems = []
    for listed in client.api.containers(all=True, quiet=True, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}):
        try:
            container = client.containers.get(listed["Id"])
        except docker.errors.NotFound:  # removed meanwhile: nothing left to break a rule
            continue
        attrs = container.attrs
        name = attrs["Name"]
        try:
            assert_container_sandboxed(attrs, allowed_gpus=RENTAL_GPUS)
        except AssertionError as exc:
            problems.append(f"{name}: breaks the sandbox: {exc}")
        dumped = json.dumps(attrs)
        if planted.secret in dumped:
            problems.append(f"{name}: the host's secret is in its configuration (env, labels, command or mounts)")
        if FOREIGN_GPU in dumped:
            problems.append(f"{name}: names a GPU no rental holds")
        labels = attrs["Config"].get("Labels") or {}
        ours = {key: value for key, value in labels.items() if key.startswith("io.gpuhost.")}
        expected = {wire.LABEL_MANAGED: "true", wire.LABEL_STACK: stack_id, wire.LABEL_RENTAL: rental_id}
        for key, value in expected.items():
            if ours.get(key) != value:
                problems.append(f"{name}: label {key}={ours.get(key)!r}, the agent sets {value!r}")
        if ours.get(wire.LABEL_SSH) == "true":
            problems.append(f"{name}: io.gpuhost.ssh=true on a stack whose template did not ask for SSH")
        if ours.get(wire.LABEL_EXPOSED_PORTS):  # on one machine Compose records expose: ports itself
            problems.append(f"{name}: {wire.LABEL_EXPOSED_PORTS}={ours[wire.LABEL_EXPOSED_PORTS]!r} on one machine")
        said = {*expected, wire.LABEL_ENV, wire.LABEL_GPUS, wire.LABEL_SSH, wire.LABEL_EXPOSED_PORTS}
        for key in set(hostile.labels) & set(ours) - said:
            problems.append(f"{name}: the file's own label {key}={ours[key]!r} is in the agent's namespace")
        if attrs["State"]["Running"]:
            found = _files_holding(container, planted.secret)
            if found:
                problems.append(f"{name}: files hold the host's secret: {found}")
    return problems


def _files_holding(container, needle: str) -> str:
    """Files of the container's own file system (volumes and tmpfs included) holding `needle`."""
    script = (
        r"find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -type f -size -2048 -print0"
        ' | xargs -0 grep -l -F -e "$1" 2>/dev/null'
    )
    result = container.exec_run(["sh", "-c", script, "sh", needle])
    return result.output.decode(errors="replace").strip() if result.exit_code == 0 else ""

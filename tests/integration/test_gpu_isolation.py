"""Rentals sharing one machine, on the real dockerd with the stand-in NVIDIA
hook: each container sees only its rental's GPUs (dockerd puts the device
request's ids into NVIDIA_VISIBLE_DEVICES, as the real toolkit would act on),
GPUs are never shared, freed when a rental ends, and one rental's containers
cannot reach another's."""

from __future__ import annotations

import asyncio

import pytest
from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.protocol import wire

GPU_STACK = f"""
services:
  train:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
    deploy:
      resources:
        reservations:
          devices: [{{driver: nvidia, count: all, capabilities: [gpu]}}]
  sidecar:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
"""

ONE_GPU_STACK = f"""
services:
  infer:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
    deploy:
      resources:
        reservations:
          devices: [{{driver: nvidia, count: 1, capabilities: [gpu]}}]
"""

WEB = f"""
services:
  web:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /www && echo secret > /www/index.html && exec httpd -f -p 8080 -h /www"]
  client:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
"""


def _env_of(docker_client, stack_id: str, service: str) -> dict:
    [container] = docker_client.containers.list(
        filters={"label": [f"{wire.LABEL_STACK}={stack_id}", f"com.docker.compose.service={service}"]}
    )
    output = container.exec_run(["env"]).output.decode()
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


async def _deploy(renter, rental_id: str, content: str) -> tuple[str, dict]:
    stack_id = await renter.stack(rental_id, content)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=30)
    return stack_id, stack


async def test_two_rentals_get_disjoint_gpus_and_a_third_waits(gpu_agent, docker_client) -> None:
    renter, parts, local, _ = await gpu_agent(gpus=4)
    await parts.session.connected.wait()
    machine = [gpu["uuid"] for gpu in (await parts.host.machine_facts())["nvml"]["gpus"]]
    assert len(machine) == 4

    rental_a, rental_b = await renter.rental(gpu_count=2), await renter.rental(gpu_count=2)
    stack_a, a = await _deploy(renter, rental_a, GPU_STACK)
    stack_b, b = await _deploy(renter, rental_b, GPU_STACK)
    assert a["status"] == wire.APPLIED and b["status"] == wire.APPLIED, (a["errorMsg"], b["errorMsg"])

    seen_a = (await asyncio.to_thread(_env_of, docker_client, stack_a, "train"))["NVIDIA_VISIBLE_DEVICES"].split(",")
    seen_b = (await asyncio.to_thread(_env_of, docker_client, stack_b, "train"))["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert len(seen_a) == 2 and len(seen_b) == 2 and not set(seen_a) & set(seen_b)
    assert set(seen_a) | set(seen_b) == set(machine)
    # count: all means all of the rental's GPUs, not the machine's; services that did not ask get none.
    assert (await asyncio.to_thread(_env_of, docker_client, stack_a, "sidecar"))["NVIDIA_VISIBLE_DEVICES"] == "void"
    # The assignment is in the stack's data on the marketplace.
    assert sorted(a["assignedGPUs"]) == sorted(seen_a) and sorted(b["assignedGPUs"]) == sorted(seen_b)

    # A second stack of rental A shares A's GPUs.
    stack_a2, a2 = await _deploy(renter, rental_a, ONE_GPU_STACK)
    assert a2["status"] == wire.APPLIED, a2["errorMsg"]
    assert (await asyncio.to_thread(_env_of, docker_client, stack_a2, "infer"))["NVIDIA_VISIBLE_DEVICES"] in seen_a

    # No GPU is left for a third rental until one of the first two ends: the marketplace refuses it.
    status, refused = await renter.call("POST", "/rentals", {"envId": renter.store.envId, "gpuCount": 1})
    assert status == 409 and "0 of its 4 GPU(s) are available" in refused["message"]

    status, _ = await renter.call("DELETE", f"/rentals/{rental_a}")
    assert status == 200
    # The marketplace sends the removals of A's stacks, then rental.end, which frees its GPUs.
    end_jobs = [job for job in local.state.store.jobs.values() if job.type == wire.JOB_RENTAL_END]
    assert [job.rentalId for job in end_jobs] == [rental_a]
    await until(lambda: end_jobs[0].outcome == wire.OUTCOME_SUCCEEDED, 30)
    assert not await asyncio.to_thread(
        docker_client.containers.list, all=True, filters={"label": f"{wire.LABEL_RENTAL}={rental_a}"}
    )
    rental_c = await renter.rental(gpu_count=1)
    stack_c, c = await _deploy(renter, rental_c, ONE_GPU_STACK)
    assert c["status"] == wire.APPLIED, c["errorMsg"]
    assert (await asyncio.to_thread(_env_of, docker_client, stack_c, "infer"))["NVIDIA_VISIBLE_DEVICES"] in seen_a


async def test_asking_for_more_gpus_than_rented_is_refused(gpu_agent, docker_client) -> None:
    renter, parts, _local, _ = await gpu_agent(gpus=4)
    rental = await renter.rental(gpu_count=2)
    trick = "    deploy: {resources: {reservations: {devices: [{driver: nvidia, count: 3, capabilities: [gpu]}]}}}\n"
    content = f"services:\n  greedy:\n    image: {TEST_IMAGE}\n    command: ['sleep', '3600']\n{trick}"
    stack_id, stack = await _deploy(renter, rental, content)
    assert stack["status"] == wire.ERROR and "greedy" in stack["errorMsg"], stack["errorMsg"]
    assert not await asyncio.to_thread(
        docker_client.containers.list, all=True, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}
    )


@pytest.mark.parametrize(
    "trick", ["    environment: {NVIDIA_VISIBLE_DEVICES: all}\n", "    environment: [NVIDIA_VISIBLE_DEVICES=all]\n"]
)
async def test_all_gpus_by_variable_means_the_rentals_gpus_only(gpu_agent, docker_client, trick) -> None:
    """NVIDIA_VISIBLE_DEVICES=all, as published files write it, is a reservation of the rental's GPUs."""
    renter, parts, _local, _ = await gpu_agent(gpus=4)
    rental = await renter.rental(gpu_count=2)
    content = f"services:\n  greedy:\n    image: {TEST_IMAGE}\n    command: ['sleep', '3600']\n{trick}"
    stack_id, stack = await _deploy(renter, rental, content)
    assert stack["status"] == wire.APPLIED and "NVIDIA_VISIBLE_DEVICES=all" in stack["errorMsg"], stack["errorMsg"]
    visible = (await asyncio.to_thread(_env_of, docker_client, stack_id, "greedy"))["NVIDIA_VISIBLE_DEVICES"]
    assert sorted(visible.split(",")) == sorted(parts.deployer.sandbox.ledger.assignments[rental])


async def test_rentals_cannot_reach_each_other(gpu_agent, docker_client) -> None:
    renter, _parts, _local, _ = await gpu_agent(gpus=0)
    rental_a, rental_b = await renter.rental(), await renter.rental()
    stack_a, a = await _deploy(renter, rental_a, WEB)
    stack_b, b = await _deploy(renter, rental_b, WEB)
    assert a["status"] == b["status"] == wire.APPLIED, (a["errorMsg"], b["errorMsg"])

    def container(stack_id: str, service: str):
        [found] = docker_client.containers.list(
            filters={"label": [f"{wire.LABEL_STACK}={stack_id}", f"com.docker.compose.service={service}"]}
        )
        return found

    web_a = await asyncio.to_thread(container, stack_a, "web")
    address_a = next(iter(web_a.attrs["NetworkSettings"]["Networks"].values()))["IPAddress"]
    client_a, client_b = [await asyncio.to_thread(container, stack, "client") for stack in (stack_a, stack_b)]

    def fetch(client, address: str) -> tuple[int, str]:
        """An HTTP GET with nc (the static busybox's wget crashes on this image)."""
        result = client.exec_run(["sh", "-c", f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {address} 8080"])
        return result.exit_code, result.output.decode(errors="replace")

    def resolve(client, name: str) -> str | None:
        """The address Docker's embedded DNS gives this container for a name."""
        result = client.exec_run(["nslookup", name, "127.0.0.11"])
        answers = [line.split()[-1] for line in result.output.decode().splitlines() if line.startswith("Address:")]
        return answers[-1] if result.exit_code == 0 and len(answers) > 1 else None

    # Inside rental A, by name and by address: the control that shows the probe works.
    assert await asyncio.to_thread(resolve, client_a, "web") == address_a
    code, output = await asyncio.to_thread(fetch, client_a, address_a)
    assert code == 0 and "secret" in output
    # From rental B: A's address leads nowhere, and A's names are not known.
    code, output = await asyncio.to_thread(fetch, client_b, address_a)
    assert code != 0 and "secret" not in output
    assert await asyncio.to_thread(resolve, client_b, web_a.name) is None
    web_b = await asyncio.to_thread(container, stack_b, "web")
    address_b = next(iter(web_b.attrs["NetworkSettings"]["Networks"].values()))["IPAddress"]
    assert await asyncio.to_thread(resolve, client_b, "web") == address_b != address_a  # B's "web" is its own service

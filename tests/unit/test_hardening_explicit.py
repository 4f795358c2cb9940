"""An image is untrusted, in the pure parts: what the image carries
(ENV, labels) never reaches the toolkit or the agent's own records, and every
container gets its own cgroup namespace. The same on the real engine:
tests/integration/test_image_labels_engine.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.machine_samples import good_host
from support.settings import stack_context

from gpuhost_agent.core.sandbox.apply import decide
from gpuhost_agent.core.sandbox.context import GIB, SandboxContext
from gpuhost_agent.core.sandbox.gpu_forms import DEVICE_VARIABLES
from gpuhost_agent.core.sandbox.harden import GPU_LABEL
from gpuhost_agent.core.sandbox.image_config import service_image_problem
from gpuhost_agent.core.sandbox.raw import RawReview
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.core.stacks.naming import stack_labels
from gpuhost_agent.core.stacks.project_input import label_services
from gpuhost_agent.core.swarm.stack_file import SwarmPlacement, swarm_stack
from gpuhost_agent.inventory import toolkit
from gpuhost_agent.inventory.compliance import evaluate
from gpuhost_agent.protocol import wire
from gpuhost_agent.protocol.requirements import Requirements

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuhost_agent"
CTX = stack_context(project="p", gpu_uuids=("GPU-a", "GPU-b"), cpus=8.0, memory_bytes=8 * GIB, pids_limit=4096)
# The toolkit's device variables at the values that add no device (sandbox_harden.NO_EXTRA_DEVICES).
NO_EXTRA_DEVICES = {
    "NVIDIA_MIG_CONFIG_DEVICES": "",
    "NVIDIA_MIG_MONITOR_DEVICES": "",
    "NVIDIA_IMEX_CHANNELS": "",
    "NVIDIA_GDS": "disabled",
    "NVIDIA_MOFED": "disabled",
    "NVIDIA_NVSWITCH": "disabled",
    "NVIDIA_GDRCOPY": "disabled",
}
PLACED = SwarmPlacement(gpu_nodes={"GPU-a": "n1", "GPU-b": "n1"}, home_node="n1")


def _decided(services: dict, ctx: SandboxContext = CTX) -> dict:
    return decide({"services": services}, RawReview(""), ctx)[0]


# ---- the agent's labels, every one, on every container ---------------------------------


def test_every_label_of_the_agents_namespace_is_set_even_when_it_means_no() -> None:
    labels = stack_labels("s", "r", "e")  # no GPUs, no SSH: the image's values would show through
    assert labels[wire.LABEL_SSH] == "" and labels[wire.LABEL_GPUS] == ""
    model = label_services({"services": {"a": {"image": "x"}}}, "s", "r", "e")
    assert model["services"]["a"]["labels"][wire.LABEL_SSH] == ""
    assert stack_labels("s", "r", "e", ["GPU-a"], ssh=True)[wire.LABEL_SSH] == "true"


def test_no_label_of_the_namespace_is_read_that_the_agent_does_not_write() -> None:
    """Any `io.gpuhost.*` name in the agent's code is one it sets on every
    container (core/stacks/naming.py, the hardening's GPU label): a new label read
    somewhere and left unset would be the image's to choose."""
    written = set(stack_labels("s", "r", "e")) | {GPU_LABEL}
    named = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith("io.gpuhost.") and not node.value.endswith(".") and " " not in node.value:
                    named.add(node.value)
    assert named <= written, sorted(named - written)


# ---- the toolkit's variables, every one, on every container ----------------------------


def test_every_toolkit_variable_is_set_on_every_container_whatever_the_image_says() -> None:
    hardened = _decided(
        {
            "gpu": {"image": "x", "deploy": {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "count": 1, "capabilities": ["gpu", "video"]}]}}}},
            "plain": {"image": "x"},
            "asks": {"image": "x", "environment": {"NVIDIA_DRIVER_CAPABILITIES": "all"}},
        }
    )  # fmt: skip
    for name, service in hardened["services"].items():
        env = service["environment"]
        assert {key: env[key] for key in NO_EXTRA_DEVICES} == NO_EXTRA_DEVICES, name
        assert set(DEVICE_VARIABLES) <= set(env), name
        assert env["NVIDIA_VISIBLE_DEVICES"] == ("GPU-a" if name == "gpu" else "void"), name
    envs = {
        name: service["environment"]["NVIDIA_DRIVER_CAPABILITIES"] for name, service in hardened["services"].items()
    }
    assert envs == {"gpu": "video", "plain": "compute,utility", "asks": "all"}  # never left to the image's ENV
    assert all(not value.startswith("enabled") for value in NO_EXTRA_DEVICES.values())


def test_the_toolkits_swarm_resource_variables_hold_the_rentals_gpus_alone() -> None:
    """A toolkit with `swarm-resource` set takes GPUs from DOCKER_RESOURCE_* before
    NVIDIA_VISIBLE_DEVICES: a file's value of them never stands."""
    hardened = _decided(
        {
            "gpu": {"image": "x", "environment": {"DOCKER_RESOURCE_GPU": "all", "DOCKER_RESOURCE_MINE": "0,1"},
                    "deploy": {"resources": {"reservations": {"devices": [{"driver": "nvidia", "count": 1}]}}}},
            "plain": {"image": "x", "environment": ["DOCKER_RESOURCE_NVIDIA-GPU=all"]},
        }
    )  # fmt: skip
    gpu, plain = (hardened["services"][name]["environment"] for name in ("gpu", "plain"))
    assert {key: value for key, value in gpu.items() if key.startswith("DOCKER_RESOURCE_")} == {
        "DOCKER_RESOURCE_GPU": "GPU-a",
        "DOCKER_RESOURCE_NVIDIA-GPU": "GPU-a",
        "DOCKER_RESOURCE_NVIDIA_GPU": "GPU-a",
        "DOCKER_RESOURCE_MINE": "GPU-a",
    }
    assert all(value == "void" for key, value in plain.items() if key.startswith("DOCKER_RESOURCE_"))


def test_an_image_that_sets_a_swarm_resource_variable_is_refused() -> None:
    service = {"image": "x", "environment": {"DOCKER_RESOURCE_GPU": "void"}}
    assert service_image_problem("a", service, {"Env": ["PATH=/bin", "DOCKER_RESOURCE_GPU=all"]}) is None
    problem = service_image_problem("a", service, {"Env": ["DOCKER_RESOURCE_OTHER=all"]})
    assert problem and "DOCKER_RESOURCE_OTHER" in problem


# ---- a cgroup namespace of its own ----------------------------------------------------


def test_every_container_has_a_private_cgroup_namespace_and_swarm_takes_the_stack() -> None:
    hardened = _decided({"a": {"image": "x"}, "b": {"image": "x", "cgroup": "private"}})
    assert {service["cgroup"] for service in hardened["services"].values()} == {"private"}
    stack, _ = swarm_stack(hardened, CTX, PLACED)  # Swarm has no such setting: the node's dockerd holds it
    assert all("cgroup" not in service for service in stack["services"].values())


# ---- the toolkit's own settings, judged by compliance ---------------------------------


def test_compliance_fails_a_toolkit_that_takes_gpus_from_mounts() -> None:
    text = "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
    assert toolkit.boolean_setting(
        text + "accept-nvidia-visible-devices-as-volume-mounts = true\n", toolkit.VOLUME_MOUNTS_KEY
    )
    data = good_host()
    kit = data["host"]["nvidiaContainerToolkit"]
    kit["acceptsDeviceListAsVolumeMounts"] = True
    (check,) = [c for c in evaluate(data, Requirements()) if c.id == "toolkit-visible-devices"]
    assert not check.ok and "/var/run/nvidia-container-devices" in check.summary
    assert "accept-nvidia-visible-devices-as-volume-mounts = false" in check.remedy
    kit["acceptsEnvvarFromUnprivileged"] = True  # both at once: one check, both fixes named
    (check,) = [c for c in evaluate(data, Requirements()) if c.id == "toolkit-visible-devices"]
    assert check.remedy.count(" = false") == 2
    kit["acceptsEnvvarFromUnprivileged"] = kit["acceptsDeviceListAsVolumeMounts"] = False
    assert all(c.ok for c in evaluate(data, Requirements()) if c.id == "toolkit-visible-devices")


def test_a_gpu_index_is_ascii_digits_alone() -> None:
    """'²' passed isdigit() and int() raised on it: the deploy crashed with a traceback."""
    for device in ("²", "٣", "0" * 6):
        services = {"app": {"image": "x", "environment": {"NVIDIA_VISIBLE_DEVICES": device}}}
        with pytest.raises(StackRejected, match="is not one of the rental's 2 GPU"):
            _decided(services)

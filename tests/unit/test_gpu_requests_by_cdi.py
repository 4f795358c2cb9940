"""With GPUs delivered through CDI, no Compose form reaches a GPU outside the
rental or another vendor's CDI device."""

from __future__ import annotations

import dataclasses

import pytest
import support.sandbox_decide as sandbox_decide
from support.sandbox_decide import RENTAL_GPUS, decide_file

from gpuhost_agent.core.sandbox.context import CDI_DELIVERY
from gpuhost_agent.runtime.compose import ComposeRunner, find_compose_command

OTHER = "GPU-99999999-9999-9999-9999-999999999999"
RESERVE = (
    "    deploy: {{resources: {{reservations: {{devices: "
    "[{{driver: cdi, device_ids: [{ids}], capabilities: [gpu]}}]}}}}}}\n"
)
FORMS = {
    "cdi all under devices": "    devices: [nvidia.com/gpu=all]\n",
    "cdi all reserved": RESERVE.format(ids="nvidia.com/gpu=all"),
    "another vendor's CDI device reserved": RESERVE.format(ids="vendor.com/device=x"),
    "mixed reservation": RESERVE.format(ids="'nvidia.com/gpu=0', 'vendor.com/device=x'"),
    "another rental's GPU by UUID": RESERVE.format(ids=f"nvidia.com/gpu={OTHER}"),
    "another vendor's CDI device under devices": "    devices: ['vendor.com/device=x']\n",
    "a CDI name with a colon under devices": "    devices: ['nvidia.com/gpu=0:/dev/sda']\n",
    "gpus with the cdi driver": f"    gpus: [{{driver: cdi, device_ids: ['nvidia.com/gpu={OTHER}']}}]\n",
    "nvidia driver with a CDI name": RESERVE.replace("driver: cdi", "driver: nvidia").format(ids="nvidia.com/gpu=all"),
}


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> ComposeRunner:
    return ComposeRunner(find_compose_command(), tmp_path_factory.mktemp("docker-config"))


@pytest.mark.parametrize("form", sorted(FORMS))
async def test_cdi_forms_reach_only_the_rentals_gpus(compose, tmp_path, monkeypatch, form) -> None:
    plain = sandbox_decide.stack_context
    monkeypatch.setattr(
        sandbox_decide, "stack_context", lambda **kw: dataclasses.replace(plain(**kw), gpu_delivery=CDI_DELIVERY)
    )
    text = "services:\n  app:\n    image: busybox\n" + FORMS[form]
    problems, hardened, _ = await decide_file(compose, text, tmp_path / "stacks" / "s")
    if problems:
        return  # refused: held
    service = hardened["services"]["app"]
    assert not service.get("devices"), service
    requests = service["deploy"]["resources"]["reservations"]["devices"]
    allowed = {f"nvidia.com/gpu={uuid}" for uuid in RENTAL_GPUS}
    for request in requests:
        assert request["driver"] == "cdi" and set(request["device_ids"]) <= allowed, request

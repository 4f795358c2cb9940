"""The agent's sandbox decision on a Compose file, as the deployer makes it but
without an engine (the raw pass, the real Compose CLI's normalisation, the
rewrites and the policy), and the invariants every hardened service holds.
Shared by the hostile, legitimate and published corpus tests."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuhost_agent.core.sandbox.apply import decide, refuse_with_compose_error, review_raw
from gpuhost_agent.core.sandbox.context import GIB, Registries
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.runtime.compose import ComposeError, ComposeRunner
from gpuhost_agent.runtime.egress_rules import BRIDGE_OPTION, bridge_name
from gpuhost_agent.streams.tunnel import read_host_networks
from support.settings import stack_context

# Networks and volumes outside the stack that hostile files try to join by name.
FOREIGN = frozenset({"bridge", "host", "none", "data", "outside", "otherproject_data", "otherproject_default"})
RENTAL_GPUS = ("GPU-11111111-1111-1111-1111-111111111111", "GPU-22222222-2222-2222-2222-222222222222")


async def decide_file(
    compose: ComposeRunner,
    text: str,
    workdir: Path,
    foreign: frozenset[str] = frozenset(),
    variables: dict[str, str] | None = None,
) -> tuple[list[str], dict | None, list[str]]:
    """(problems, the hardened model, notices), as the agent decides: the raw
    pass, Compose's own normalisation, the rewrites and the policy."""
    try:
        variables = variables or {}
        raw = review_raw(text, variables.get("COMPOSE_PROFILES", ""))
        await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread((workdir / "compose.yaml").write_text, raw.text)
        try:
            model, raw.compose_warnings = await compose.config_and_warnings(
                "corpus", workdir, "compose.yaml", variables
            )
        except ComposeError as exc:
            raise refuse_with_compose_error(raw, str(exc)) from None
        ctx = stack_context(
            project="corpus",
            gpu_uuids=RENTAL_GPUS,
            cpus=4.0,
            memory_bytes=8 * GIB,
            project_dir=str(await asyncio.to_thread(workdir.resolve)),
            home_dir=str(compose.home_dir),
            agent_dir=str(workdir.parent.parent),  # as state/stacks/<stack id>
            foreign_names=foreign,
            registries=Registries(allowed=("127.0.0.1:5000",), host=tuple(await asyncio.to_thread(read_host_networks))),
        )
        hardened, notices = decide(model, raw, ctx)
    except StackRejected as exc:
        return [str(exc)], None, []
    return [], hardened, notices


def assert_sandboxed(hardened: dict) -> None:
    """What every container the agent starts holds, whatever the file asked."""
    for name, service in hardened["services"].items():
        assert service["security_opt"] == ["no-new-privileges:true"] and "NET_RAW" in service["cap_drop"], name
        assert not service.get("privileged") and not service.get("devices") and not service.get("runtime"), name
        assert service["logging"]["options"] == {"max-size": "50m", "max-file": "3"}, name
        assert service.get("ipc") in (None, "private", "shareable", "none") or service["ipc"].startswith("service:")
        assert all(mount.get("type") != "bind" for mount in service.get("volumes") or []), name
        assert "container_name" not in service, name  # one namespace for the whole host
        assert int(service["mem_limit"]) <= 8 * GIB and service["cpus"] <= 4.0 and service["pids_limit"] <= 4096
        visible = service["environment"]["NVIDIA_VISIBLE_DEVICES"]
        assert visible == "void" or set(visible.split(",")) <= set(RENTAL_GPUS), name
        memlock = (service.get("ulimits") or {}).get("memlock")
        if memlock is not None:
            assert all(0 <= int(v) <= 8 * GIB for v in (memlock.values() if isinstance(memlock, dict) else [memlock]))
    for section in ("networks", "volumes"):
        for key, spec in (hardened.get(section) or {}).items():
            assert not (spec or {}).get("external") and (spec or {}).get("name") in (None, f"corpus_{key}"), key
    for key, spec in (hardened.get("networks") or {}).items():  # the egress rules match every rental's bridge
        assert spec["driver_opts"] == {BRIDGE_OPTION: bridge_name("corpus", key)} and spec["enable_ipv6"] is False, key

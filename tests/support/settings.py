"""The settings' declared defaults, for tests that build one part of the agent
by hand: service/settings_table.py is the one place a default is written, so
a test takes it from there rather than writing it again."""

from __future__ import annotations

from typing import Any

from gpuhost_agent.core.rentals.shares import NoRentalCgroups
from gpuhost_agent.core.sandbox.context import SandboxContext
from gpuhost_agent.core.sandbox.placement import OneMachinePlacement
from gpuhost_agent.service.config import default_of


def defaults(*names: str) -> dict[str, Any]:
    """Each named AgentConfig field's declared default, by name."""
    return {name: default_of(name) for name in names}


async def every_image_absent(images: list[str]) -> list[str]:
    """As if the engine had none of the images: every registry named is judged."""
    return images


def sandbox_settings(**overrides: Any) -> dict[str, Any]:
    """Sandbox's settings and parts as an agent on one machine without the
    local marketplace has them, but no rental cgroups (a unit test does not
    write the host's cgroups) and no disk floor: a test machine's free disk is
    not the point (the floor's own tests set one)."""
    values = defaults("pids_limit", "log_max_size", "log_max_files", "rental_disk_bytes", "allowed_registries")
    values.update(publish_address="0.0.0.0", disk_floor_bytes=0)
    values.update(shares=NoRentalCgroups(), placement=OneMachinePlacement(), images_absent=every_image_absent)
    values.update(overrides)
    return values


def stack_context(**fields: Any) -> SandboxContext:
    """A stack's SandboxContext for the sandbox's pure parts: the host's
    settings as declared (the publish address as without the local
    marketplace), the rest as given."""
    values: dict[str, Any] = defaults("pids_limit", "log_max_size", "log_max_files")
    values.update(publish_address="0.0.0.0")
    values.update(fields)
    return SandboxContext(**values)

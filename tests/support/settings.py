"""The settings' declared defaults, for tests that build one part of the agent
by hand: service/settings_table.py is the one place a default is written, so
a test takes it from there rather than writing it again."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.rentals.shares import NoRentalCgroups
from gpuhost_agent.core.sandbox.apply import MachineFacts, Sandbox, SandboxParts, SandboxRules
from gpuhost_agent.core.sandbox.context import SandboxContext
from gpuhost_agent.core.sandbox.placement import OneMachinePlacement
from gpuhost_agent.service.config import default_of


def defaults(*names: str) -> dict[str, Any]:
    """Each named AgentConfig field's declared default, by name."""
    return {name: default_of(name) for name in names}


async def every_image_absent(images: list[str]) -> list[str]:
    """As if the engine had none of the images: every registry named is judged."""
    return images


def sandbox_for(ledger: GpuLedger, machine_facts: MachineFacts, **overrides: Any) -> Sandbox:
    """A Sandbox with the settings and parts an agent on one machine without
    the local marketplace has, but no rental cgroups (a unit test does not
    write the host's cgroups) and no disk floor: a test machine's free disk is
    not the point (the floor's own tests set one). `overrides` name fields of
    SandboxParts or SandboxRules."""
    values = defaults("pids_limit", "log_max_size", "log_max_files", "rental_disk_bytes", "allowed_registries")
    values.update(publish_address="0.0.0.0", disk_floor_bytes=0)
    values.update(shares=NoRentalCgroups(), placement=OneMachinePlacement(), images_absent=every_image_absent)
    values.update(ledger=ledger, machine_facts=machine_facts)
    values.update(overrides)
    parts = {name: values.pop(name) for name in [f.name for f in fields(SandboxParts)]}
    return Sandbox(parts=SandboxParts(**parts), rules=SandboxRules(**values))


def stack_context(**fields: Any) -> SandboxContext:
    """A stack's SandboxContext for the sandbox's pure parts: the host's
    settings as declared (the publish address as without the local
    marketplace), the rest as given."""
    values: dict[str, Any] = defaults("pids_limit", "log_max_size", "log_max_files")
    values.update(publish_address="0.0.0.0")
    values.update(fields)
    return SandboxContext(**values)

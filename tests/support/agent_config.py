"""The configuration of an agent the tests start in their own event loop."""

from __future__ import annotations

from pathlib import Path

from gpuhost_agent.service.config import AgentConfig


def make_config(state_dir: Path, **overrides) -> AgentConfig:
    values = dict(
        marketplace_url=None,
        env_id=None,
        api_key=None,
        state_dir=state_dir,
        local_listen=("127.0.0.1", 0),
        local_api_key="renter-test-key",
        log_level="warning",
        compose_command=None,
        settle_seconds=1.0,
        stop_timeout=1,
        speed_max_bytes=500_000,
        speed_max_seconds=1.0,
        disk_floor_bytes=0,  # a test machine's free disk is not the point (tests/integration/test_disk_floor.py)
        allowed_registries=("127.0.0.1:5000",),  # the local test registry (scripts/build-test-images.sh)
        pull_guard=None,  # as in tests/support/agent_process.py: one port for many agents
    )
    values.update(overrides)
    return AgentConfig(**values)

"""The NVIDIA Container Toolkit detection against executables that answer
--version the way the toolkit's do, and the host probe with no engine to ask.
(Against the real Docker Engine and Compose CLI: tests/integration/test_host_probe_engine.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpuhost_agent.inventory import toolkit
from gpuhost_agent.inventory.host_probe import probe_host
from gpuhost_agent.runtime.engine.client import DockerEngine

REPO = Path(__file__).resolve().parents[2]


def _tool(directory: Path, name: str, output: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    path.chmod(0o755)


async def test_toolkit_version_from_nvidia_ctk(tmp_path) -> None:
    await asyncio.to_thread(
        _tool, tmp_path, "nvidia-ctk", "NVIDIA Container Toolkit CLI version 1.17.8\ncommit: 5bc0315"
    )
    await asyncio.to_thread(_tool, tmp_path, "nvidia-container-cli", "cli-version: 1.16.2\nlib-version: 1.16.2")
    config = tmp_path / "config.toml"
    await asyncio.to_thread(
        config.write_text,
        "[nvidia-container-cli]\nldconfig = '@/sbin/ldconfig'\n"
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false # as advised\n",
    )
    found = await toolkit.probe_toolkit(search_path=str(tmp_path), config_path=config)
    assert found == {
        "installed": True,
        "version": "1.17.8",
        "binaries": ["nvidia-container-cli", "nvidia-ctk"],
        "configPath": str(config),
        "configFound": True,
        "acceptsEnvvarFromUnprivileged": False,
        "acceptsDeviceListAsVolumeMounts": False,
    }


async def test_toolkit_version_from_the_cli_when_ctk_is_missing(tmp_path) -> None:
    await asyncio.to_thread(_tool, tmp_path, "nvidia-container-cli", "cli-version: 1.16.2\nlib-version: 1.16.2")
    found = await toolkit.probe_toolkit(search_path=str(tmp_path), config_path=tmp_path / "absent.toml")
    assert found["version"] == "1.16.2"
    # No config file: the toolkit's default applies, which accepts the variable.
    assert found["configFound"] is False and found["acceptsEnvvarFromUnprivileged"] is True


async def test_hook_without_a_version_and_no_toolkit(tmp_path) -> None:
    found = await toolkit.probe_toolkit(
        search_path=str(REPO / "scripts" / "fake-nvidia"), config_path=tmp_path / "none.toml"
    )
    assert found["installed"] and found["binaries"] == ["nvidia-container-runtime-hook"] and found["version"] is None
    empty = tmp_path / "empty"
    await asyncio.to_thread(empty.mkdir)
    assert (await toolkit.probe_toolkit(search_path=str(empty)))["installed"] is False


@pytest.mark.parametrize(
    "text, expected",
    [
        ("accept-nvidia-visible-devices-envvar-when-unprivileged = true\n", True),
        ("accept-nvidia-visible-devices-envvar-when-unprivileged=false\n", False),
        ("#accept-nvidia-visible-devices-envvar-when-unprivileged = false\n", None),
        ("disable-require = false\n", None),
    ],
)
def test_unprivileged_setting_parsing(text, expected) -> None:
    assert toolkit.unprivileged_envvar_setting(text) is expected


async def test_engine_unreachable_is_reported_not_raised(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    engine = DockerEngine(timeout=3)
    try:
        host = await probe_host(engine, None)
    finally:
        await engine.close()
    assert host["docker"]["available"] is False and "no-docker.sock" in host["docker"]["error"]
    assert host["docker"]["gpuContainers"]["ok"] is False
    assert host["storage"]["path"] == "/var/lib/docker"  # Docker's default, measured all the same

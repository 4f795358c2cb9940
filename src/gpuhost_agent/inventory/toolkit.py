"""NVIDIA Container Toolkit: is it there, which version, and how is it set up.

The toolkit is what gives containers their GPUs, and it is where the known
container escapes were (CVE-2024-0132, CVE-2025-23359, CVE-2025-23266, all
fixed by 1.17.8). Its default also lets any container ask for any GPU through
NVIDIA_VISIBLE_DEVICES, which would let a renter reach GPUs rented to someone
else; the secure setting is an explicit `false` in its config file. Its other
way to name devices, mounts onto /var/run/nvidia-container-devices (which the
toolkit reads before the variable), is off by default and must stay off: the
agent never gives GPUs that way, so such a mount could only be a renter's.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path

DEFAULT_CONFIG = Path("/etc/nvidia-container-runtime/config.toml")
UNPRIVILEGED_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
VOLUME_MOUNTS_KEY = "accept-nvidia-visible-devices-as-volume-mounts"
# In the order we ask them for a version: nvidia-ctk is the toolkit's own CLI.
BINARIES = (
    "nvidia-ctk",
    "nvidia-container-cli",
    "nvidia-container-runtime",
    "nvidia-container-runtime-hook",
    "nvidia-container-toolkit",
)
_VERSION = re.compile(r"version[:\s]+v?(\d+\.\d+\.\d+)", re.IGNORECASE)


def find_binaries(search_path: str | None = None) -> dict[str, str]:
    path = search_path if search_path is not None else os.environ.get("PATH", "") + ":/usr/bin:/usr/local/bin:/usr/sbin"
    found = {}
    for name in BINARIES:
        where = shutil.which(name, path=path)
        if where:
            found[name] = where
    return found


def parse_version(output: str) -> str | None:
    match = _VERSION.search(output)
    return match.group(1) if match else None


def unprivileged_envvar_setting(config_text: str | None) -> bool | None:
    """The value of accept-nvidia-visible-devices-envvar-when-unprivileged, or
    None when the file does not set it (the toolkit then accepts: true)."""
    return boolean_setting(config_text, UNPRIVILEGED_KEY)


def boolean_setting(config_text: str | None, wanted: str) -> bool | None:
    """A boolean key of the toolkit's config.toml, or None when the file does not set it."""
    if config_text is None:
        return None
    for line in config_text.splitlines():
        key, sep, value = line.split("#", 1)[0].partition("=")
        if sep and key.strip() == wanted:
            return value.strip().lower() == "true"
    return None


async def _version_of(binary: str, timeout: float = 5) -> str | None:
    try:
        process = await asyncio.create_subprocess_exec(
            binary,
            "--version",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError:
        return None
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        return None
    return parse_version(output.decode(errors="replace"))


async def probe_toolkit(search_path: str | None = None, config_path: Path | None = None) -> dict:
    binaries = await asyncio.to_thread(find_binaries, search_path)
    version = None
    for name in BINARIES:
        if name in binaries:
            version = await _version_of(binaries[name])
            if version:
                break
    config_path = config_path or DEFAULT_CONFIG
    try:
        config_text: str | None = await asyncio.to_thread(config_path.read_text)
    except OSError:
        config_text = None
    setting = unprivileged_envvar_setting(config_text)
    return {
        "installed": bool(binaries),
        "version": version,
        "binaries": sorted(binaries),
        "configPath": str(config_path),
        "configFound": config_text is not None,
        # What the toolkit will do, the default (true) included.
        "acceptsEnvvarFromUnprivileged": True if setting is None else setting,
        "acceptsDeviceListAsVolumeMounts": boolean_setting(config_text, VOLUME_MOUNTS_KEY) is True,  # default false
    }

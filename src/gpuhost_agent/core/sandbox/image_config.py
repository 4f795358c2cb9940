"""A renter's image judged before its containers start, and again once they
run. Pure.

An image's configuration (ENV, CMD, labels, HEALTHCHECK, STOPSIGNAL, volumes,
exposed ports...) is copied by the engine into every container of it, and a
registry serves whatever configuration was pushed: `docker build` refuses a
20 MB STOPSIGNAL or a negative healthcheck interval, a hand-written image
config does not. Copied into containers, 20 MB of it made every container
list of the engine take seconds, for every renter, and the agent's calls
time out. So an image's configuration is at most
256 KiB as the engine's JSON counts it (labels, 64 KiB at most, among it:
core/sandbox/label_size.py), with at most 32 VOLUME paths and 256 EXPOSE
ports, and its healthcheck, merged with the file's as
the engine merges them, probes at most once a second
(core/sandbox/healthcheck.py). Both are judged on the pulled images before
`up`, so no such container starts (on one machine the agent pulls every
image and Compose none: core/stacks/image_checks.py); and once more on the
started containers: the healthcheck, and an inspect of at most 1 MiB (the
image's configuration and the file's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpuhost_agent.core.sandbox.harden import TOOLKIT_RESOURCE_PREFIX
from gpuhost_agent.core.sandbox.healthcheck import file_over_image, started_healthcheck_problem
from gpuhost_agent.core.sandbox.label_size import json_bytes

MAX_IMAGE_CONFIG_BYTES = 256 * 1024
# Within those bytes, counts that cost the engine per entry: each VOLUME is an
# anonymous volume made at create and removed at `down` (18,000 fit in 256 KiB;
# 5,000 took the engine 30 s to make and 38 s to remove, and another renter's
# container create twice as long meanwhile), each EXPOSE an entry of every
# container list (15,000: 525 KB of one container's list entry). Images
# declare a few of each.
MAX_IMAGE_VOLUMES = 32
MAX_IMAGE_EXPOSED_PORTS = 256  # as a stack's file may expose (core/sandbox/host_network.py)
MAX_INSPECT_BYTES = 1024 * 1024  # what the agent reads of an image's or a container's inspect


def _kib(size: int) -> str:
    return f"{size / 1024:,.0f} KiB"


def config_size_problem(what: str, config: Mapping[str, Any]) -> str | None:
    """An image's configuration over the limit."""
    size = json_bytes(json.dumps(config, ensure_ascii=False))
    if size <= MAX_IMAGE_CONFIG_BYTES:
        return None
    return (
        f"{what}'s configuration is {_kib(size)} (its image's ENV, CMD, labels, healthcheck, STOPSIGNAL...), at most "
        f"{_kib(MAX_IMAGE_CONFIG_BYTES)}: the engine copies it into every container and its lists read it for "
        "every renter; use an image with a smaller configuration"
    )


def too_large_problem(what: str) -> str:
    """The engine's inspect of `what` was over what the agent reads (a
    container's: its image's configuration and the file's together)."""
    return (
        f"{what}'s configuration is over {_kib(MAX_INSPECT_BYTES)} (its image's ENV, CMD, labels, healthcheck... "
        "and the file's): the engine copies it into every container and its lists read it for every renter; "
        "use an image with a smaller configuration"
    )


def service_image_problem(name: str, service: Mapping[str, Any], image_config: Mapping[str, Any]) -> str | None:
    """A service of the hardened file against its pulled image's configuration."""
    what = f'service "{name}" (image {str(service.get("image"))[:200]!r})'
    if problem := config_size_problem(what, image_config):
        return problem
    for key, said, most in (
        ("Volumes", "VOLUME paths (each an anonymous volume the engine makes and removes)", MAX_IMAGE_VOLUMES),
        ("ExposedPorts", "EXPOSE ports (each in every container list of the engine)", MAX_IMAGE_EXPOSED_PORTS),
    ):
        count = len(image_config.get(key) or {})
        if count > most:
            return f"{what} declares {count:,} {said}, at most {most}; use an image that declares fewer"
    environment = service.get("environment")
    environment = environment if isinstance(environment, Mapping) else {}
    for entry in image_config.get("Env") or []:
        variable = str(entry).split("=", 1)[0]
        if variable.upper().startswith(TOOLKIT_RESOURCE_PREFIX) and variable not in environment:
            return (
                f"{what} sets {variable[:80]} in its ENV, which the NVIDIA Container Toolkit may take as the GPUs "
                "to give the container; use an image without it"
            )
    merged = file_over_image(service.get("healthcheck"), image_config.get("Healthcheck"))
    return started_healthcheck_problem(f'service "{name}"', merged)


def started_container_problem(name: str, config: Mapping[str, Any]) -> str | None:
    """A started container's `Config` (its image's with the file's merged in;
    its size is bounded by what the agent reads of the inspect)."""
    return started_healthcheck_problem(f"container {name}", config.get("Healthcheck"))

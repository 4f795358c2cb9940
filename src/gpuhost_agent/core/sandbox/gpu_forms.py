"""Every way a Compose file can ask Docker for NVIDIA GPUs, turned into the one
form the policy judges and the hardening assigns: a device reservation with
driver nvidia. Pure.

Published files ask in many ways: `runtime: nvidia` (with or without
NVIDIA_VISIBLE_DEVICES), `gpus: all`, reservations with `count: all`,
`device_ids`, capabilities such as `[compute, utility]` without `gpu`, CDI
names (`driver: cdi` with `nvidia.com/gpu=all`, or the same name under
`devices:`), and the device nodes themselves (`/dev/nvidia0`). All of them mean
"these GPUs"; none may mean more than the rental's: the policy then checks
counts and indexes against the rental, and the hardening gives the UUIDs.

Of the NVIDIA_* variables, only those the NVIDIA Container Toolkit reads are
the agent's: NVIDIA_VISIBLE_DEVICES becomes a reservation, the ones that
would add devices (MIG management, IMEX channels, GPUDirect, NVSwitch) are
dropped, and NVIDIA_DRIVER_CAPABILITIES and NVIDIA_REQUIRE_* stay (they pick
driver libraries and check versions). Others, such as NIM's NVIDIA_API_KEY,
are the application's and pass.
"""

from __future__ import annotations

import re

from gpuhost_agent.core.sandbox.context import SandboxContext

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
DEVICE_VARIABLES = (
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "NVIDIA_IMEX_CHANNELS",
    "NVIDIA_GDS",
    "NVIDIA_MOFED",
    "NVIDIA_NVSWITCH",
    "NVIDIA_GDRCOPY",
)
PASSED_VARIABLES = ("NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_DISABLE_REQUIRE")
PASSED_PREFIXES = ("NVIDIA_REQUIRE_",)
TOOLKIT_VARIABLES = (VISIBLE, *DEVICE_VARIABLES, *PASSED_VARIABLES)
NVIDIA_CAPABILITIES = {"gpu", "nvidia", "compute", "compat32", "utility", "graphics", "video", "display"}
CDI_GPU = re.compile(r"^nvidia\.com/gpu=(.+)$")
DEVICE_NODE = re.compile(r"^/dev/nvidia(\d+)$")
# Given with any GPU by the toolkit itself: asking for them adds nothing.
TOOLKIT_NODES = re.compile(r"^/dev/nvidia(ctl|-uvm|-uvm-tools|-modeset|-caps(/.*)?)$")
ALL = -1  # Compose's count for "all"


def is_toolkit_variable(name: str) -> bool:
    return name in TOOLKIT_VARIABLES or name.startswith(PASSED_PREFIXES)


def normalise(service: dict, ctx: SandboxContext, where: str, notices: list[str], problems: list[str]) -> None:
    asks: list[tuple[str, object]] = []  # (the key as written, ALL or device ids: indexes or UUIDs)
    _reservations(service, asks, where, notices)
    _devices(service, asks, where, notices)
    environment = service.get("environment")
    environment = environment if isinstance(environment, dict) else {}
    visible = environment.pop(VISIBLE, None) if VISIBLE in environment else None
    for name in DEVICE_VARIABLES:
        if name in environment:
            environment.pop(name)
            notices.append(f"{where}: environment {name} dropped: it would give the container more devices")
    runtime = service.get("runtime")
    if runtime == "nvidia":
        service.pop("runtime")
    has_request = bool(_requests(service))
    if visible not in (None, "", "none", "void") and not has_request:
        ids = [part.strip() for part in str(visible).split(",") if part.strip()]
        asks.append((f"environment {VISIBLE}", ALL if ids == ["all"] else ids))
        notices.append(f"{where}: environment {VISIBLE}={visible} became a reservation of the rental's GPUs")
    elif runtime == "nvidia" and not has_request and not asks:
        asks.append(("runtime", ALL))
        notices.append(f"{where}: runtime nvidia became a reservation of all the rental's GPUs")
    wrong = [f"{where}: {key}: {_not_the_rentals(ask, ctx)}" for key, ask in asks if _not_the_rentals(ask, ctx)]
    problems += wrong
    if asks and not wrong:
        _add_request(service, [ask for _, ask in asks])


def _not_the_rentals(ask: object, ctx: SandboxContext) -> str:
    """Why an ask names a GPU that is not the rental's, or ""."""
    count = len(ctx.gpu_uuids)
    for device in ask if isinstance(ask, list) else []:
        index = device.isascii() and device.isdigit() and len(device) < 5  # "²" and "٣" are digits to isdigit()
        if device not in ctx.gpu_uuids and not (index and int(device) < count):
            allowed = f"use 0 to {count - 1}" if count else "it has none"
            return f"GPU {device!r} is not one of the rental's {count} GPU(s) ({allowed})"
    return ""


def _requests(service: dict) -> list:
    reservations = ((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}
    return list(reservations.get("devices") or []) + list(service.get("gpus") or [])


def _reservations(service: dict, asks: list[tuple[str, object]], where: str, notices: list[str]) -> None:
    """CDI requests for nvidia.com/gpu become GPU asks; capabilities that
    name only NVIDIA's driver parts are a GPU request too (the `gpu` added)."""
    reservations = ((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}
    kept = []
    for request in reservations.get("devices") or []:
        ids = [str(x) for x in request.get("device_ids") or []]
        matches = [CDI_GPU.match(x) for x in ids]
        if request.get("driver") == "cdi" and ids and all(matches):
            picked = [m.group(1) for m in matches if m]
            asks.append(("deploy.resources.reservations.devices", ALL if "all" in picked else picked))
            notices.append(
                f"{where}: deploy.resources.reservations.devices CDI {', '.join(ids)} "
                "became a reservation of the rental's GPUs"
            )
            continue
        capabilities = {str(c) for item in request.get("capabilities") or [] for c in _flat(item)}
        if capabilities and capabilities <= NVIDIA_CAPABILITIES and request.get("driver") in (None, "", "nvidia"):
            request["capabilities"] = sorted(capabilities | {"gpu"})
        kept.append(request)
    if "devices" in reservations:
        reservations["devices"] = kept
        if not kept:
            reservations.pop("devices")


def _devices(service: dict, asks: list[tuple[str, object]], where: str, notices: list[str]) -> None:
    """CDI names and NVIDIA device nodes under `devices:`; any other device stays for the policy to refuse."""
    kept = []
    for device in service.get("devices") or []:
        source = str(device.get("source", "")) if isinstance(device, dict) else str(device).split(":")[0]
        cdi, node = CDI_GPU.match(source), DEVICE_NODE.match(source)
        if cdi:
            asks.append((f"devices {source}", ALL if cdi.group(1) == "all" else [cdi.group(1)]))
        elif node:
            asks.append((f"devices {source}", [node.group(1)]))
        elif not TOOLKIT_NODES.match(source):
            kept.append(device)
            continue
        notices.append(f"{where}: devices {source} became a reservation of the rental's GPUs")
    if "devices" in service:
        service["devices"] = kept


def _add_request(service: dict, asks: list) -> None:
    request: dict = {"driver": "nvidia", "capabilities": ["gpu"]}
    if ALL in asks:
        request["count"] = ALL
    else:
        request["device_ids"] = list(dict.fromkeys(x for ask in asks if isinstance(ask, list) for x in ask))
    deploy = service.setdefault("deploy", {}) or {}
    service["deploy"] = deploy
    resources = deploy.setdefault("resources", {})
    resources.setdefault("reservations", {}).setdefault("devices", []).append(request)


def _flat(item: object) -> list:
    return item if isinstance(item, list) else [item]

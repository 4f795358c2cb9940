"""The sandbox policy's rules for a stack's networks and the mount points the
NVIDIA toolkit reads. Pure: part of sandbox_policy.

The renter never chooses an address. A subnet, range or gateway of the
renter's (`ipam`), a container's `ipv4_address`, `ipv6_address`,
`link_local_ips` or `mac_address`, and endpoint `driver_opts` are refused:
the engine assigns every address from its own pools, which never overlap the
host's routes. An address of the renter's choosing could be the host's own
(its LAN address, a bridge gateway) or the cloud's metadata address, and the
agent's tunnel dials the address the engine records for a container
(streams/tunnel.py, which refuses such addresses too). What a service may say
about a network it joins is an allow-list (`aliases`, `priority`,
`gw_priority`, `interface_name`): names and an order among the stack's own
networks, none of them an address. A network's keys are an allow-list too.

`extra_hosts`, `dns`, `dns_search` and `dns_opt` are not judged here: they
write the container's own /etc/hosts and resolv.conf, and its queries leave
from its own network namespace, where any address it could name is one it
could already send packets to.

The NVIDIA container toolkit (with `accept-nvidia-visible-devices-as-volume-mounts`)
takes a container's GPU list from the names of its mounts under
/var/run/nvidia-container-devices. No mount of any kind (volume, tmpfs,
config, secret) may have a target there, in any spelling.
"""

from __future__ import annotations

ENGINE_ASSIGNS = "the renter never chooses an address: the engine assigns addresses from its own pools"
NETWORK_KEYS = {
    "name",
    "driver",
    "driver_opts",
    "labels",
    "external",
    "internal",
    "attachable",
    "ipam",
    "enable_ipv4",
    "enable_ipv6",
}
ATTACHMENT_KEYS = {"aliases", "priority", "gw_priority", "interface_name"}
ADDRESS_KEYS = ("ipv4_address", "ipv6_address", "link_local_ips", "mac_address", "driver_opts")
DEVICE_LIST_DIR = "nvidia-container-devices"  # the toolkit's /var/run/nvidia-container-devices
DEVICE_LIST_WHY = (
    "the NVIDIA toolkit reads GPU requests from mounts under /var/run/nvidia-container-devices; "
    "ask for GPUs with deploy.resources.reservations.devices"
)


def network_problems(where: str, spec: dict) -> list[str]:
    """A top-level network of the stack (`where`: 'network "n"')."""
    problems = []
    ipam = spec.get("ipam")
    if ipam not in (None, {}) and not (
        isinstance(ipam, dict) and set(ipam) <= {"driver"} and ipam.get("driver") in (None, "", "default")
    ):
        problems.append(f"{where}: ipam is not allowed: {ENGINE_ASSIGNS} (no subnet, range, gateway or IPAM driver)")
    if spec.get("enable_ipv6"):
        problems.append(
            f"{where}: enable_ipv6 is not allowed: the engine has no IPv6 pool of its own, "
            f"so its addresses would be the renter's; {ENGINE_ASSIGNS}"
        )
    for key in sorted(set(spec) - NETWORK_KEYS):
        if not str(key).startswith("x-"):
            problems.append(f"{where}: {key} is not allowed")
    return problems


def attachment_problems(service: dict) -> list[str]:
    """How a service joins networks, and its own MAC address."""
    problems = []
    if service.get("mac_address") not in (None, ""):
        problems.append(f"mac_address is not allowed: {ENGINE_ASSIGNS}")
    networks = service.get("networks")
    for net, spec in networks.items() if isinstance(networks, dict) else ():
        if not isinstance(spec, dict):
            continue
        for key in ADDRESS_KEYS:
            if spec.get(key) not in (None, "", [], {}):
                problems.append(f"networks.{net}.{key} is not allowed: {ENGINE_ASSIGNS}")
        for key in sorted(set(spec) - ATTACHMENT_KEYS - set(ADDRESS_KEYS)):
            if not str(key).startswith("x-"):
                problems.append(f"networks.{net}.{key} is not allowed")
    return problems


def device_list_mounts(service: dict) -> list[str]:
    """Mounts whose target is in the toolkit's device-list directory, whatever
    the spelling (`//`, `/./`, `..`, a trailing slash, /run for /var/run, a
    relative config or secret target): any target that names the directory."""
    problems = []
    for key in ("volumes", "tmpfs", "configs", "secrets"):
        entries = service.get(key)
        for entry in [entries] if isinstance(entries, str) else entries or []:
            target = str(entry.get("target") or "") if isinstance(entry, dict) else str(entry)
            if DEVICE_LIST_DIR in target.lower():
                problems.append(f"{key}: a mount onto {target[:200]!r} is not allowed: {DEVICE_LIST_WHY}")
    return problems

"""Which address of a container a tunnel may dial. Pure: the
engine's records and the host's own addresses in, a reason to refuse out.

The policy already refuses every address a renter could choose
(core/sandbox/networks.py); this holds whatever the engine recorded anyway (a
network attached from outside the agent, an engine that honoured something
the policy did not see). A tunnel is a connection the host makes, so an
address is dialled only when it is none of the host's own (any address of any
interface of the host's network namespace, loopback, the bridges' gateways),
not link-local (169.254/16, fe80::/10, where cloud metadata services live),
not multicast, broadcast, unspecified or reserved, and inside the subnet of a
network the agent created for the container's stack (read from the engine:
the stack's networks' IPAM config), other than that network's gateway or its
own network and broadcast addresses.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable

from gpuhost_agent.runtime.egress_rules import IPV4_REFUSED

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# The label that says which stack made a network, in the order the agent's containers carry them:
# Compose's project (one machine), Swarm's stack namespace.
STACK_LABELS = ("com.docker.compose.project", "com.docker.stack.namespace")
Judge = Callable[[str], str | None]  # an address -> why a tunnel may not dial it, or None


def network_ids(info: dict) -> list[str]:
    """The ids of the networks a container is on (from `docker inspect`)."""
    networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
    return [str(net["NetworkID"]) for net in networks.values() if isinstance(net, dict) and net.get("NetworkID")]


def stack_networks(info: dict, networks: Iterable[dict]) -> list[dict]:
    """Those of `networks` (the engine's inspects of the networks the
    container is on) that its own stack created: they carry the container's
    project (or stack namespace) label. An image's label of either name
    cannot widen this: only the container's own networks are looked at."""
    labels = (info.get("Config") or {}).get("Labels") or {}
    own = {(key, labels[key]) for key in STACK_LABELS if isinstance(labels, dict) and labels.get(key)}
    return [
        net
        for net in networks
        if isinstance(net, dict) and own & {(key, (net.get("Labels") or {}).get(key)) for key in STACK_LABELS}
    ]


def _subnets(networks: Iterable[dict]) -> tuple[list[IPNetwork], set[IPAddress]]:
    subnets, gateways = [], set()
    for net in networks:
        for config in (net.get("IPAM") or {}).get("Config") or []:
            if not isinstance(config, dict):
                continue
            try:
                subnets.append(ipaddress.ip_network(str(config.get("Subnet") or ""), strict=False))
                if config.get("Gateway"):
                    gateways.add(ipaddress.ip_address(str(config["Gateway"]).split("/")[0]))
            except ValueError:
                continue
    return subnets, gateways


def host_networks(fib_trie: str, if_inet6: str) -> list[IPNetwork]:
    """What the host answers for itself, from /proc/net/fib_trie (each local
    route: an address of an interface, or a whole local prefix such as
    127.0.0.0/8) and /proc/net/if_inet6 (each IPv6 address of an interface)."""
    found: set[IPNetwork] = set()
    last = ""
    for line in fib_trie.splitlines():
        text = line.strip()
        if text.startswith("|-- "):
            last = text[4:].strip()
        elif text.startswith("/") and text.endswith("host LOCAL") and last:
            try:
                found.add(ipaddress.ip_network(f"{last}/{text[1:].split()[0]}", strict=False))
            except ValueError:
                continue
    for line in if_inet6.splitlines():
        hexed = (line.split() or [""])[0]
        if len(hexed) == 32:
            try:
                found.add(ipaddress.ip_network(":".join(hexed[i : i + 4] for i in range(0, 32, 4))))
            except ValueError:
                continue
    return sorted(found, key=str)


def address_problem(address: str, networks: Iterable[dict], host: Iterable[IPNetwork]) -> str | None:
    """Why a tunnel may not dial `address` of a container whose stack's
    networks are `networks` (stack_networks), on a host that answers for
    `host` (host_networks); None when it may."""
    try:
        ip: IPAddress = ipaddress.ip_address(address)
    except ValueError:
        return f"the container's address {address[:60]!r} is not an IP address: the agent does not dial it"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    why = _special(ip)
    if why is None and any(ip in net for net in host if net.version == ip.version):
        why = "an address of the host itself"
    subnets, gateways = _subnets(networks)
    if why is None and ip in gateways:
        why = "the gateway of the stack's network (the host's side of it)"
    inside = [net for net in subnets if net.version == ip.version and ip in net]
    if why is None and not inside:
        why = "outside the networks the agent created for this stack"
    if why is None and all(
        net.num_addresses > 2 and ip in (net.network_address, net.broadcast_address) for net in inside
    ):
        why = "the network's own address, not a container's"
    return None if why is None else f"the container's address {ip} is {why}: the agent does not dial it"


def special_address(ip: IPAddress) -> str | None:
    """Why `ip` is none of a remote machine's own addresses (loopback,
    link-local, unspecified, multicast, reserved), IPv4-mapped IPv6 and
    0.0.0.0/8 (this network: the host itself) included; None when it may
    be one. Also judges image registries (core/sandbox/host_network.py)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv4Address) and ip in THIS_NETWORK:
        return "unspecified (this network: the host itself)"
    return _special(ip)


THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")


def registry_address_problem(ip: IPAddress, host: Iterable[IPNetwork], opened: Iterable[IPNetwork] = ()) -> str | None:
    """Why the host's engine may not fetch images from `ip` (a special
    address, one of `host`, the host's own, or a range a rental's containers
    may not reach either: private networks, where the host's bridges and so
    other rentals' containers are, carrier-grade NAT, a cloud's own services;
    unless the operator opened it, `opened`: GPUHOST_EGRESS_ALLOW); None when
    it may. Judges a renter's registry (core/sandbox/host_network.py) and
    every connection of a pull (streams/pull_guard.py)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    why = special_address(ip)
    if why is None and any(ip in net for net in host if net.version == ip.version):
        why = "an address of this host"
    if why is None and not any(ip in net for net in opened if net.version == ip.version):
        if any(ip in net for net in PRIVATE_REFUSED if net.version == ip.version):
            why = "private (the host's networks, other rentals' containers, a cloud's own services)"
    return why


# What a rental's containers may not reach beyond the special addresses (runtime/egress_rules.py), and IPv6's
# unique local addresses (fc00::/7: AWS's metadata service answers on fd00:ec2::254).
PRIVATE_REFUSED: tuple[IPNetwork, ...] = (
    *(ipaddress.ip_network(net) for net in IPV4_REFUSED),
    ipaddress.ip_network("fc00::/7"),
)


def _special(ip: IPAddress) -> str | None:
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "link-local (where cloud metadata services answer)"
    if ip.is_multicast or ip.is_unspecified or ip.is_reserved or ip == ipaddress.IPv4Address("255.255.255.255"):
        return "not one host's address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "not one host's address"
    return None


def judge(info: dict, networks: Iterable[dict], host: Iterable[IPNetwork]) -> Judge:
    """address_problem for each address of one container, with its stack's
    networks picked once from `networks` (the engine's inspects of the
    networks it is on)."""
    own, local = stack_networks(info, networks), list(host)
    return lambda address: address_problem(address, own, local)

"""Where a rental's containers may connect: the firewall rules, as data. Pure.

Every network of a rental's stack is a bridge whose name the agent sets
(`bridge_name`: the prefix `gpuh` and a hash of project and network), so one
set of rules, matched on that prefix, holds for every rental whatever its
networks. Traffic a rental's container starts may go to its own stack (the
same bridge) and to the internet. It may not reach:

- another rental's containers, routed to another bridge or through a port
  the host publishes (the host's NAT rewrites it): refused here, whether or
  not the engine keeps isolation chains of its own;

- the host itself, on any of its addresses (the bridge's gateway, its LAN or
  public address, IPv6 link-local on the bridge): the INPUT chain;
- the special-purpose ranges: private networks (the host's LAN, other
  machines of a Swarm and their doors), carrier-grade NAT, link-local (the
  cloud's metadata service at 169.254.169.254 and its credentials), loopback,
  multicast and reserved space: the FORWARD chain, through DOCKER-USER, the
  chain Docker leaves to the host and keeps at FORWARD's head.

A Swarm stack's containers are on overlays, which leave the machine
through the engine's `docker_gwbridge`: the same rules hold for traffic
from it (their own stack is reached over the overlay, never through it).

Replies to connections made into the container (published ports, the
agent's tunnels, SSH sessions) pass; so do DNS queries to the host's own
nameservers, which the engine forwards from the container's namespace; and
whatever the operator opens (GPUHOST_EGRESS_ALLOW: a registry mirror, a proxy).

The engine fence holds dockerd's and the agent's own
connections, both in the group ENGINE_GROUP (install.sh): a pull follows a
renter's registry's redirects and token realm, and Go's proxy choice never
sends localhost or a loopback literal to the pull guard. So the kernel
refuses their new connections to the host itself (the loopback interface,
which carries the host's own addresses too) and to link-local addresses,
except the pull guard, DNS, the Swarm's own ports and what the host allowed.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass

BRIDGE_PREFIX = "gpuh"  # + 11 hex digits: 15 characters, the kernel's limit for an interface name
# A Swarm stack's containers leave their overlays through this bridge, which
# the engine makes when the machine joins a Swarm (no stack bridge of ours).
SWARM_GATEWAY = "docker_gwbridge"
BRIDGE_OPTION = "com.docker.network.bridge.name"
FORWARD_CHAIN = "GPUHOST-EGRESS"  # what a rental's container may reach beyond the host
HOST_CHAIN = "GPUHOST-HOST"  # what it may reach of the host: replies only
DOCKER_USER = "DOCKER-USER"
ENGINE_CHAIN = "GPUHOST-ENGINE"  # where dockerd's and the agent's own new connections may go on the host
ENGINE_GROUP = "gpuhost-engine"  # their supplementary group (install.sh): the fence's match
GUARD_CHAIN = "GPUHOST-GUARD"  # who may connect to the pull guard: root's processes alone
SWARM_LOCAL = (("tcp", "2377,7946"), ("udp", "7946,4789"))  # a Swarm node's engine talks to itself on these
SETTING = "GPUHOST_EGRESS_ALLOW"
IPV4_REFUSED = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "168.63.129.16/32",  # Azure's WireServer: a public address, the VM's goal state and extensions' settings
)
LINK_LOCAL = ipaddress.ip_network("169.254.0.0/16")  # never opened: the metadata service's instance credentials
MIN_OPENED_PREFIX = 8  # an opening wider than 10.0.0.0/8 would undo the confinement
REPLIES = ("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN")
REFUSE = ("-j", "REJECT")


def bridge_name(project: str, network: str) -> str:
    """The Linux bridge of one network of one stack: the rules' match."""
    digest = hashlib.sha256(f"{project}\0{network}".encode()).hexdigest()
    return BRIDGE_PREFIX + digest[:11]


@dataclass(frozen=True)
class Rule:
    """One iptables rule: `<tool> -t filter -A <chain> <args>`; tool "iptables" or "ip6tables"."""

    tool: str
    chain: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Jump:
    """A rule that sends a rental's traffic from `interface` (or what `match`
    matches, as iptables -S prints it) into one of the agent's chains; the
    agent's jumps are kept the first rules of `parent` (DOCKER-USER, or
    FORWARD where the engine has none; INPUT; OUTPUT for the engine fence)."""

    tool: str
    parent: str
    chain: str
    interface: str = BRIDGE_PREFIX + "+"
    match: tuple[str, ...] = ()

    @property
    def args(self) -> tuple[str, ...]:
        return (*(self.match or ("-i", self.interface)), "-j", self.chain)

    @property
    def label(self) -> str:
        return f"{self.tool} {self.parent} {' '.join(self.match or ('-i', self.interface))} -> {self.chain}"


@dataclass(frozen=True)
class Opening:
    """An address (or a name the firewall resolves when it writes the rules)
    and TCP port the engine fence lets dockerd and the agent reach on the
    host: the pull guard (`guard`: the one only root's processes may reach),
    an allowed registry, the host's proxy, the marketplace on this machine,
    what the operator opened (GPUHOST_FENCE_ALLOW: a log collector)."""

    host: str
    port: int
    guard: bool = False


REGISTRY_PORTS = (443, 80)  # a registry named without a port: HTTPS, or HTTP where it is insecure
# Metadata services that are not link-local, refused to dockerd and the agent too (the guard refuses them
# already; this holds for whatever does not go through it): Alibaba's, Azure's WireServer, AWS's over IPv6.
FENCE_REFUSED = {4: ("169.254.0.0/16", "100.100.100.200/32", "168.63.129.16/32"), 6: ("fe80::/10", "fd00:ec2::254/128")}


def split_host_port(text: str) -> tuple[str, int | None]:
    """`host[:port]` or `[v6][:port]` as (host, port or None)."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
    return host, int(port_text) if port_text.isdigit() and 0 < int(port_text) < 65536 else None


def engine_openings(
    guard: tuple[str, int] | None,
    registries: tuple[str, ...],
    upstream: tuple[str, int] | None,
    marketplace: tuple[str, int] | None = None,
    opened: tuple[str, ...] = (),
) -> tuple[Opening, ...]:
    """The fence's openings from the settings: the guard; the allowed
    registries (their port, or HTTPS's and HTTP's); the upstream proxy; the
    marketplace's address (on this machine, it is on loopback); what the
    operator opened. Names stay names: the firewall resolves them."""
    found = [Opening(*guard, guard=True)] if guard else []
    for pair in (upstream, marketplace):
        if pair:
            found.append(Opening(*pair))
    for entry in (*registries, *opened):
        host, port = split_host_port(entry)
        found += [Opening(host, port)] if port else [Opening(host, default) for default in REGISTRY_PORTS]
    unique: list[Opening] = []
    for opening in found:
        if opening.host and opening not in unique:
            unique.append(opening)
    return tuple(unique)


def engine_rules(openings: tuple[tuple[str, int], ...], nameservers: tuple[str, ...] = ()) -> list[Rule]:
    """The fence, for IPv4 and IPv6: replies to what came in (a published
    port's proxy, the agent's listeners); the openings (addresses, ports);
    DNS to a loopback resolver and to the host's nameservers (a cloud's
    resolver may be link-local: 169.254.169.254 on GCE, 168.63.129.16 on
    Azure) and the Swarm's own ports on the host; then nothing else of the
    host, nor link-local and the metadata services. An opening that is itself
    one of those refused addresses is left out (fence_opening)."""
    rules = []
    for tool, version, loopback in (("iptables", 4, "127.0.0.0/8"), ("ip6tables", 6, "::1/128")):
        rules.append(Rule(tool, ENGINE_CHAIN, REPLIES))
        for address, port in openings:
            if ipaddress.ip_address(address).version == version and fence_opening(address):
                rules.append(
                    Rule(tool, ENGINE_CHAIN, ("-d", address, "-p", "tcp", "--dport", str(port), "-j", "RETURN"))
                )
        resolvers = [("-d", loopback, "-o", "lo")] + [
            ("-d", server) for server in nameservers if ipaddress.ip_address(server).version == version
        ]
        for where in resolvers:
            for protocol in ("udp", "tcp"):
                rules.append(Rule(tool, ENGINE_CHAIN, (*where, "-p", protocol, "--dport", "53", "-j", "RETURN")))
        for protocol, ports in SWARM_LOCAL:
            swarm = ("-o", "lo", "-p", protocol, "-m", "multiport", "--dports", ports, "-j", "RETURN")
            rules.append(Rule(tool, ENGINE_CHAIN, swarm))
        rules.append(Rule(tool, ENGINE_CHAIN, ("-o", "lo", *REFUSE)))
        rules += [Rule(tool, ENGINE_CHAIN, ("-d", refused, *REFUSE)) for refused in FENCE_REFUSED[version]]
    return rules


def fence_opening(address: str) -> bool:
    """Whether an opening's address may be opened: never link-local or a
    metadata service's, whatever a setting or a name's answer says."""
    ip = ipaddress.ip_address(address)
    refused = FENCE_REFUSED[ip.version]
    return not any(ip in ipaddress.ip_network(net) for net in refused)


def guard_rules(guards: tuple[tuple[str, int], ...]) -> list[Rule]:
    """The pull guard's door: only root's processes (dockerd, the agent) may
    open a connection to it (a new one: a closed socket of root's has no
    owner left, and its last packets must pass), and only root's may answer
    from its port (another user who took the port while the agent restarted
    gets no connection); the kernel refuses the rest before the
    guard holds a descriptor for it."""
    rules = []
    not_root = ("-m", "owner", "!", "--uid-owner", "0", "-j", "REJECT", "--reject-with", "tcp-reset")
    for address, port in guards:
        tool = "iptables" if ipaddress.ip_address(address).version == 4 else "ip6tables"
        rules.append(Rule(tool, GUARD_CHAIN, ("-d", address, "-p", "tcp", "--dport", str(port), "--syn", *not_root)))
        answer = ("-s", address, "-p", "tcp", "--sport", str(port), "--tcp-flags", "SYN,ACK", "SYN,ACK")
        rules.append(Rule(tool, GUARD_CHAIN, (*answer, *not_root)))
    return rules


def guard_jumps(tools: set[str]) -> list[Jump]:
    """From OUTPUT, every process's TCP: the guard's chain judges its own port alone."""
    return [
        Jump(tool, "OUTPUT", GUARD_CHAIN, match=("-p", "tcp")) for tool in ("iptables", "ip6tables") if tool in tools
    ]


def engine_jumps(gid: int) -> list[Jump]:
    """From OUTPUT, for every process in the group `gid` (its supplementary groups counted)."""
    match = ("-m", "owner", "--gid-owner", str(gid), "--suppl-groups")
    return [Jump(tool, "OUTPUT", ENGINE_CHAIN, match=match) for tool in ("iptables", "ip6tables")]


def allowed_networks(value: str) -> tuple[tuple[str, ...], list[str]]:
    """GPUHOST_EGRESS_ALLOW, comma or space separated addresses or CIDR
    networks (IPv4), as (networks, problems)."""
    networks, problems = [], []
    for word in value.replace(",", " ").split():
        try:
            network = ipaddress.ip_network(word, strict=False)
        except ValueError:
            example = "for example 10.0.0.5 or 10.0.8.0/24"
            problems.append(f"{SETTING}: {word!r} is not an IPv4 address or network ({example})")
            continue
        if network.version != 4:
            problems.append(f"{SETTING}: {word!r} is IPv6; a rental's networks are IPv4 only")
            continue
        if network.overlaps(LINK_LOCAL):
            problems.append(f"{SETTING}: {word!r} opens link-local addresses, the cloud's metadata service among them")
            continue
        if network.prefixlen < MIN_OPENED_PREFIX:
            problems.append(f"{SETTING}: {word!r} opens more than a whole private range (/8 at most)")
            continue
        networks.append(str(network))
    return tuple(networks), problems


def forward_rules(allowed: tuple[str, ...], nameservers: tuple[str, ...]) -> list[Rule]:
    """The FORWARD side, in order: replies; a connection the host's NAT sent
    elsewhere (a published port of the host's, which leads to another rental's
    container) refused; the stack's own bridge (bridged, not routed: another
    bridge is another stack); the operator's openings, the host's DNS, then
    the refused ranges."""
    rules = [Rule("iptables", FORWARD_CHAIN, REPLIES)]
    rules.append(Rule("iptables", FORWARD_CHAIN, ("-m", "conntrack", "--ctstate", "DNAT", *REFUSE)))
    own_bridge = ("-o", BRIDGE_PREFIX + "+", "-m", "physdev", "--physdev-is-bridged", "-j", "RETURN")
    rules.append(Rule("iptables", FORWARD_CHAIN, own_bridge))
    rules += [Rule("iptables", FORWARD_CHAIN, ("-d", network, "-j", "RETURN")) for network in allowed]
    for server in nameservers:
        for protocol in ("udp", "tcp"):
            dns = ("-d", server, "-p", protocol, "--dport", "53", "-j", "RETURN")
            rules.append(Rule("iptables", FORWARD_CHAIN, dns))
    rules += [Rule("iptables", FORWARD_CHAIN, ("-d", refused, *REFUSE)) for refused in IPV4_REFUSED]
    return rules


def host_rules() -> list[Rule]:
    """The INPUT side, for IPv4 and IPv6 (the bridge's link-local address):
    replies to what the host opened, nothing else."""
    return [Rule(tool, HOST_CHAIN, args) for tool in ("iptables", "ip6tables") for args in (REPLIES, REFUSE)]


def jumps(has_docker_user: bool) -> list[Jump]:
    """From a stack's bridges and from SWARM_GATEWAY, in each parent chain."""
    parent = DOCKER_USER if has_docker_user else "FORWARD"
    return [
        Jump(tool, chain_parent, chain, interface)
        for tool, chain_parent, chain in (
            ("iptables", parent, FORWARD_CHAIN),
            ("iptables", "INPUT", HOST_CHAIN),
            ("ip6tables", "INPUT", HOST_CHAIN),
        )
        for interface in (BRIDGE_PREFIX + "+", SWARM_GATEWAY)
    ]


MAX_NAMED = 20  # networks named in a report


def unconfined(networks: list[dict]) -> list[str]:
    """The names of the agent's bridge networks (from the engine's list, its
    managed label asked) whose Linux bridge the rules do not match: made before
    stack networks were named `gpuh…` (a `br-` bridge), until their stack is
    deployed again."""
    found = []
    for network in networks:
        bridge = str((network.get("Options") or {}).get(BRIDGE_OPTION) or "")
        if network.get("Driver") == "bridge" and not bridge.startswith(BRIDGE_PREFIX):
            found.append(str(network.get("Name") or network.get("Id") or "?")[:128])
    return sorted(found)[:MAX_NAMED]


def nameservers_of(resolv_conf: str) -> tuple[str, ...]:
    """The IPv4 nameservers of a resolv.conf text that are not loopback (for
    a loopback resolver such as systemd-resolved's the engine uses its upstreams)."""
    found = []
    for line in resolv_conf.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                address = ipaddress.ip_address(words[1])
            except ValueError:
                continue
            if address.version == 4 and not address.is_loopback and str(address) not in found:
                found.append(str(address))
    return tuple(found)

"""The egress rules as data (runtime/egress_rules.py) and the bridge names the
sandbox gives every network of a stack, which those rules match.
On the real engine: tests/integration/test_egress_engine.py."""

from __future__ import annotations

import asyncio
import ipaddress

from structlog.testing import capture_logs
from support.settings import stack_context

from gpuhost_agent.core.egress_keeper import EgressKeeper
from gpuhost_agent.core.sandbox.harden import harden
from gpuhost_agent.runtime.egress_rules import (
    BRIDGE_OPTION,
    BRIDGE_PREFIX,
    FORWARD_CHAIN,
    allowed_networks,
    bridge_name,
    forward_rules,
    host_rules,
    nameservers_of,
    unconfined,
)
from gpuhost_agent.runtime.host_firewall import HostFirewall


def test_bridge_names_fit_the_kernel_and_differ_per_project_and_network() -> None:
    names = {bridge_name(project, network) for project in ("s-1", "s-2") for network in ("default", "back")}
    assert len(names) == 4
    assert all(len(name) <= 15 and name.startswith(BRIDGE_PREFIX) for name in names)
    assert bridge_name("s-1", "default") == bridge_name("s-1", "default")


def test_every_network_of_a_hardened_stack_is_a_bridge_of_the_agents_naming() -> None:
    model = {
        "services": {"app": {"image": "x", "networks": {"default": None, "back": None}}},
        "networks": {"default": {"name": "p1_default"}, "back": None},
    }
    hardened = harden(model, stack_context(project="p1"))
    assert hardened["networks"]["default"] == {
        "name": "p1_default",
        "driver_opts": {BRIDGE_OPTION: bridge_name("p1", "default")},
        "enable_ipv6": False,
    }
    assert hardened["networks"]["back"] == {
        "driver_opts": {BRIDGE_OPTION: bridge_name("p1", "back")},
        "enable_ipv6": False,
    }
    assert "driver_opts" not in (model["networks"]["default"] or {}), "the input model is left as it was"


def test_the_refused_ranges_cover_the_host_its_networks_and_the_metadata_service() -> None:
    rules = forward_rules((), ())
    refused = [
        ipaddress.ip_network(rule.args[1]) for rule in rules if rule.args[0] == "-d" and rule.args[-1] == "REJECT"
    ]
    for address in (
        "169.254.169.254",
        "168.63.129.16",
        "10.1.2.3",
        "172.17.0.1",
        "192.168.1.10",
        "100.100.100.200",
        "127.0.0.1",
    ):
        assert any(ipaddress.ip_address(address) in network for network in refused), address
    for address in ("203.0.113.2", "8.8.8.8", "1.1.1.1"):
        assert not any(ipaddress.ip_address(address) in network for network in refused), address
    assert rules[0].args[-2:] == ("-j", "RETURN") and "RELATED,ESTABLISHED" in rules[0].args  # replies first


def test_what_the_operator_opens_and_the_hosts_dns_pass_before_any_refusal() -> None:
    rules = forward_rules(("10.0.8.0/24",), ("10.255.255.53",))
    returns = [index for index, rule in enumerate(rules) if rule.args[-1] == "RETURN"]
    ranges = [index for index, rule in enumerate(rules) if rule.args[0] == "-d" and rule.args[-1] == "REJECT"]
    assert max(returns) < min(ranges)
    # Before any opening: what the host's NAT sent elsewhere (a published port: another rental's container),
    # and only bridged traffic to a rental's bridge (its own stack), never routed to another.
    assert rules[1].args == ("-m", "conntrack", "--ctstate", "DNAT", "-j", "REJECT")
    assert "--physdev-is-bridged" in rules[2].args and rules[2].args[:2] == ("-o", BRIDGE_PREFIX + "+")
    dns = [rule.args for rule in rules if "10.255.255.53" in rule.args]
    assert all(args[args.index("--dport") + 1] == "53" for args in dns) and len(dns) == 2  # DNS alone, udp and tcp
    assert all(rule.chain == FORWARD_CHAIN for rule in rules)
    assert [(rule.tool, rule.args[-1]) for rule in host_rules()] == [
        ("iptables", "RETURN"),
        ("iptables", "REJECT"),
        ("ip6tables", "RETURN"),
        ("ip6tables", "REJECT"),
    ]


def test_the_setting_takes_ipv4_addresses_and_networks_and_names_what_is_not() -> None:
    assert allowed_networks("10.0.0.5, 10.0.8.7/24 192.0.2.1") == (("10.0.0.5/32", "10.0.8.0/24", "192.0.2.1/32"), [])
    networks, problems = allowed_networks("proxy.lan,fd00::1")
    assert networks == () and len(problems) == 2 and "'proxy.lan'" in problems[0] and "IPv6" in problems[1]
    # What would undo the confinement is refused whatever the operator wrote.
    networks, problems = allowed_networks("169.254.169.254, 169.254.0.0/15, 0.0.0.0/0, 10.0.0.0/7")
    assert networks == () and len(problems) == 4, problems
    assert all("metadata" in problem for problem in problems[:3]) and "/8 at most" in problems[3]


def test_nameservers_are_the_non_loopback_ipv4_ones() -> None:
    text = "# comment\nnameserver 127.0.0.53\nnameserver 10.255.255.53\nnameserver ::1\nnameserver 10.255.255.53\n"
    assert nameservers_of(text + "nameserver bogus\nsearch lan\n") == ("10.255.255.53",)


async def test_a_host_without_iptables_is_said_once_and_the_agent_goes_on(tmp_path) -> None:
    """A PATH without iptables stands for such a host (the GPU test machine's): the
    keeper logs the error once, not every minute, and the probe reports it."""
    firewall = HostFirewall(path=str(tmp_path))
    keeper = EgressKeeper(firewall, ())
    with capture_logs() as logged:
        await keeper.run_once()
        await keeper.run_once()
    said = [line for line in logged if line["event"] == "egress_not_confined"]
    assert len(said) == 1 and said[0]["log_level"] == "error", logged
    assert keeper.problem and "iptables is not installed" in keeper.problem
    facts = await asyncio.to_thread(firewall.facts, ())
    assert facts == {"confined": False, "differs": None, "error": keeper.problem}
    assert await asyncio.to_thread(firewall.remove) == []  # nothing of the agent's can be there to remove


def test_the_agents_networks_the_rules_do_not_hold_are_named() -> None:
    """A stack deployed before stack networks were named gpuh…: its br- bridge."""
    networks = [
        {"Name": "new_default", "Driver": "bridge", "Options": {BRIDGE_OPTION: bridge_name("new", "default")}},
        {"Name": "old_default", "Driver": "bridge", "Options": {}},
        {"Name": "old_back", "Driver": "bridge", "Options": {BRIDGE_OPTION: "br-custom"}},
        {"Name": "swarm_inside", "Driver": "overlay", "Options": {}},  # leaves through docker_gwbridge
    ]
    assert unconfined(networks) == ["old_back", "old_default"]


def test_the_engine_fences_openings_name_a_port_each_and_names_are_resolved_when_written() -> None:
    """The fence refused what a host legitimately needs on loopback (the marketplace on this
    machine, a proxy or registry given by name, a log collector), and a registry written without a port
    opened every port of its address. Each opening is now a TCP port, its name resolved when the rules
    are written; the guard's alone is also closed to every user but root."""
    from gpuhost_agent.runtime.egress_rules import Opening, engine_openings
    from gpuhost_agent.runtime.host_firewall import HostFirewall

    openings = engine_openings(
        ("127.0.0.1", 47128),
        ("localhost:5000", "10.0.0.5"),
        ("127.0.0.1", 3128),
        ("localhost", 8787),
        ("127.0.0.1:24224",),
    )
    assert openings == (
        Opening("127.0.0.1", 47128, guard=True),
        Opening("127.0.0.1", 3128),
        Opening("localhost", 8787),
        Opening("localhost", 5000),
        Opening("10.0.0.5", 443),
        Opening("10.0.0.5", 80),
        Opening("127.0.0.1", 24224),
    )
    rules = [(rule.tool, rule.chain, " ".join(rule.args)) for rule in HostFirewall(group="daemon").wanted((), openings)]
    fence = [(tool, args) for tool, chain, args in rules if chain == "GPUHOST-ENGINE"]
    for address, port in (("127.0.0.1", 8787), ("127.0.0.1", 5000), ("10.0.0.5", 443), ("127.0.0.1", 24224)):
        assert ("iptables", f"-d {address} -p tcp --dport {port} -j RETURN") in fence, (address, port)
    assert not any("10.0.0.5 -j RETURN" in args for _, args in fence)  # never every port of an address
    assert ("iptables", "-d 168.63.129.16/32 -j REJECT") in fence  # a metadata service off link-local
    guard = [(tool, args) for tool, chain, args in rules if chain == "GPUHOST-GUARD"]
    not_root = "-m owner ! --uid-owner 0 -j REJECT --reject-with tcp-reset"
    assert guard == [  # new connections alone (root's closed sockets have no owner); no squatter answers
        ("iptables", f"-d 127.0.0.1 -p tcp --dport 47128 --syn {not_root}"),
        ("iptables", f"-s 127.0.0.1 -p tcp --sport 47128 --tcp-flags SYN,ACK SYN,ACK {not_root}"),
    ]


def test_the_fence_lets_dns_reach_the_hosts_nameservers_and_never_opens_a_metadata_address(tmp_path) -> None:
    """A cloud's resolver may be link-local (GCE's 169.254.169.254, Azure's 168.63.129.16):
    the fence refused dockerd's and the agent's DNS there. And no setting or name's answer opens
    link-local or a metadata service's address."""
    from gpuhost_agent.runtime.egress_rules import engine_openings
    from gpuhost_agent.runtime.host_firewall import HostFirewall

    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 169.254.169.254\nnameserver 168.63.129.16\n")
    openings = engine_openings(None, ("169.254.169.254:80",), None, None, ("100.100.100.200:80", "127.0.0.1:24224"))
    rules = HostFirewall(group="daemon", resolv_confs=(resolv,)).wanted((), openings)
    fence = [" ".join(rule.args) for rule in rules if rule.chain == "GPUHOST-ENGINE" and rule.tool == "iptables"]
    for server in ("169.254.169.254", "168.63.129.16"):
        for protocol in ("udp", "tcp"):
            dns = f"-d {server} -p {protocol} --dport 53 -j RETURN"
            assert fence.index(dns) < fence.index("-d 169.254.0.0/16 -j REJECT"), fence
    assert "-d 127.0.0.1 -p tcp --dport 24224 -j RETURN" in fence
    opened = [rule for rule in fence if "--dport 53" not in rule and rule.endswith("RETURN")]
    assert not any("169.254.169.254" in rule or "100.100.100.200" in rule for rule in opened), opened

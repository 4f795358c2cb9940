"""The renter never chooses an address, and a tunnel never dials the host
(and the NVIDIA device-list mounts are refused).

The policy on Compose's normalised model (core/sandbox/networks.py), the pure
judgement of a container's address (streams/sandbox_addresses.py), and the
tunnel's refusal before it dials (streams/tunnel.py). On the real engine
through the local marketplace: tests/integration/test_tunnel_addresses_engine.py;
the corpus files 120-139 in tests/sandbox_corpus/hostile/.
"""

from __future__ import annotations

import ipaddress

import pytest
from support.settings import stack_context

from gpuhost_agent.core.sandbox.policy import policy_violations
from gpuhost_agent.runtime.engine.streams import ContainerAt
from gpuhost_agent.streams import sandbox_addresses
from gpuhost_agent.streams.admission import connect_tunnel
from gpuhost_agent.streams.requests import Refusal, TunnelRequest
from gpuhost_agent.streams.sandbox_addresses import address_problem, host_networks, stack_networks
from gpuhost_agent.streams.tunnel import address_judge, read_host_networks

CTX = stack_context(project="p")
APP = {"image": "busybox"}


def _problems(service: dict | None = None, networks: dict | None = None) -> list[str]:
    model: dict = {"services": {"app": {**APP, **(service or {})}}}
    if networks is not None:
        model["networks"] = networks
    return policy_violations(model, CTX)


@pytest.mark.parametrize(
    ("attachment", "key"),
    [
        ({"ipv4_address": "192.0.2.2"}, "ipv4_address"),
        ({"ipv6_address": "fd00::2"}, "ipv6_address"),
        ({"link_local_ips": ["169.254.169.254"]}, "link_local_ips"),
        ({"mac_address": "02:42:ac:11:00:01"}, "mac_address"),
        ({"driver_opts": {"com.docker.network.endpoint.sysctls": "x"}}, "driver_opts"),
        ({"ipv4_address": "10.0.0.1", "aliases": ["db"]}, "ipv4_address"),
        ({"x-ok": 1, "future_address_key": "10.0.0.1"}, "future_address_key"),
    ],
)
def test_a_service_may_not_choose_its_address_on_a_network(attachment: dict, key: str) -> None:
    problems = _problems({"networks": {"n": attachment}}, {"n": {}})
    assert any(f"networks.n.{key} is not allowed" in text and '"app"' in text for text in problems), problems
    if key != "future_address_key":
        assert any("the engine assigns addresses" in text for text in problems), problems


def test_a_service_may_not_choose_its_mac_address() -> None:
    problems = _problems({"mac_address": "02:42:ac:11:00:01"})
    assert problems == ['service "app": mac_address is not allowed: ' + problems[0].split(": ", 2)[2]], problems
    assert "the engine assigns" in problems[0]


@pytest.mark.parametrize(
    "spec",
    [
        {"ipam": {"config": [{"subnet": "192.0.2.0/24"}]}},
        {"ipam": {"config": [{"subnet": "169.254.0.0/16", "gateway": "169.254.169.254"}]}},
        {"ipam": {"driver": "default", "config": [{"subnet": "10.9.0.0/24", "ip_range": "10.9.0.0/28"}]}},
        {"ipam": {"driver": "renter-plugin"}},
        {"ipam": {"options": {"a": "b"}}},
        {"ipam": {"config": [{"aux_addresses": {"h": "10.9.0.2"}}]}},
        {"ipam": "anything else"},
    ],
)
def test_a_network_may_not_choose_its_subnet(spec: dict) -> None:
    problems = _problems(networks={"default": spec})
    assert any(text.startswith('network "default": ipam is not allowed') for text in problems), problems


def test_ipv6_and_unknown_network_keys_are_refused() -> None:
    problems = _problems(networks={"n": {"enable_ipv6": True, "future_key": 1, "x-note": 2}})
    assert any('network "n": enable_ipv6 is not allowed' in text for text in problems), problems
    assert any('network "n": future_key is not allowed' in text for text in problems), problems
    assert not any("x-note" in text for text in problems)


def test_what_names_or_orders_the_stacks_own_networks_passes() -> None:
    service = {
        "networks": {"n": {"aliases": ["db"], "priority": 5, "gw_priority": 1, "interface_name": "eth1"}, "m": None},
        "extra_hosts": ["example.test=10.1.2.3"],  # the container's own /etc/hosts
        "dns": ["192.0.2.53"],  # asked from the container's own network namespace
        "dns_search": ["example.test"],
        "dns_opt": ["ndots:1"],
    }
    networks = {"n": {"internal": True, "ipam": {"driver": "default"}, "enable_ipv4": True}, "m": {"ipam": {}}}
    assert _problems(service, networks) == []


@pytest.mark.parametrize(
    ("key", "entries"),
    [
        ("volumes", [{"type": "volume", "source": "v", "target": "/var/run/nvidia-container-devices/all"}]),
        ("volumes", [{"type": "volume", "target": "/var/run//nvidia-container-devices/./GPU-0/"}]),
        ("volumes", [{"type": "tmpfs", "target": "/run/nvidia-container-devices"}]),
        ("volumes", [{"type": "volume", "target": "/var/run/NVIDIA-CONTAINER-DEVICES/all"}]),
        ("volumes", ["v:/var/run/nvidia-container-devices/all"]),
        ("tmpfs", ["/var/run/nvidia-container-devices/all:size=1k"]),
        ("tmpfs", "/var/run/nvidia-container-devices/all"),
        ("configs", [{"source": "c", "target": "../../var/run/nvidia-container-devices/all"}]),
        ("secrets", [{"source": "s", "target": "/var/run/nvidia-container-devices/0"}]),
    ],
)
def test_no_mount_lands_in_the_toolkits_device_list_directory(key: str, entries: object) -> None:
    problems = _problems({key: entries})
    assert any(f"{key}: a mount onto" in text and "nvidia-container-devices" in text for text in problems), problems


def test_ordinary_mounts_pass() -> None:
    service = {
        "volumes": [{"type": "volume", "source": "v", "target": "/data"}, {"type": "tmpfs", "target": "/var/run"}],
        "tmpfs": ["/tmp:size=1m"],
        "configs": [{"source": "c", "target": "/etc/app.conf"}],
    }
    assert _problems(service) == []


STACK = [
    {
        "Id": "n1",
        "Labels": {"com.docker.compose.project": "p"},
        "IPAM": {"Config": [{"Subnet": "172.20.0.0/16", "Gateway": "172.20.0.1"}]},
    }
]
HOST = [ipaddress.ip_network(n) for n in ("127.0.0.0/8", "192.0.2.2/32", "172.17.0.1/32", "::1/128")]


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "not one host's"),
        ("0.0.0.0", "not one host's"),
        ("255.255.255.255", "not one host's"),
        ("192.0.2.2", "the host itself"),
        ("172.17.0.1", "the host itself"),
        ("172.20.0.1", "gateway"),
        ("172.21.0.5", "outside the networks"),
        ("172.20.255.255", "the network's own address"),
        ("not-an-address", "not an IP address"),
    ],
)
def test_what_a_tunnel_never_dials(address: str, why: str) -> None:
    problem = address_problem(address, STACK, HOST)
    assert problem is not None and why in problem and "the agent does not dial it" in problem, problem


def test_a_containers_address_on_its_stacks_network_is_dialled() -> None:
    assert address_problem("172.20.0.5", STACK, HOST) is None
    # the host owning the same address wins over the stack's subnet
    assert "the host itself" in (
        address_problem("172.20.0.7", STACK, [*HOST, ipaddress.ip_network("172.20.0.7")]) or ""
    )


def test_only_the_containers_own_stacks_networks_count() -> None:
    other = {**STACK[0], "Id": "n2", "Labels": {"com.docker.compose.project": "q"}}
    swarm = {**STACK[0], "Id": "n3", "Labels": {"com.docker.stack.namespace": "s"}}
    mine = {"Config": {"Labels": {"com.docker.compose.project": "p"}}}
    assert stack_networks(mine, [STACK[0], other, swarm]) == [STACK[0]]
    assert stack_networks({"Config": {"Labels": {"com.docker.stack.namespace": "s"}}}, [STACK[0], swarm]) == [swarm]
    assert stack_networks({"Config": {"Labels": {}}}, STACK) == []
    # a Swarm container whose image carries a Compose project label: its stack's overlay still counts
    both = {"Config": {"Labels": {"com.docker.compose.project": "x", "com.docker.stack.namespace": "s"}}}
    assert stack_networks(both, [STACK[0], swarm]) == [swarm]


FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     |-- 192.0.2.2
        /32 host LOCAL
     |-- 10.0.0.0
        /8 host LOCAL
"""
IF_INET6 = "00000000000000000000000000000001 01 80 10 80       lo\nfd000000000000000000000000000002 02 40 00 80 eth0\n"


def test_the_hosts_own_addresses_are_read_from_the_kernel() -> None:
    found = {str(net) for net in host_networks(FIB_TRIE, IF_INET6)}
    assert found == {"127.0.0.0/8", "127.0.0.1/32", "192.0.2.2/32", "10.0.0.0/8", "::1/128", "fd00::2/128"}
    real = read_host_networks()  # this machine's: loopback at least
    assert any(ipaddress.ip_address("127.0.0.1") in net for net in real), real


def _request() -> TunnelRequest:
    return TunnelRequest("t1", "r1", "s1", "c" * 64, 8080)


def _info(*addresses: str) -> dict:
    return {
        "Id": "c" * 64,
        "Config": {"ExposedPorts": {"8080/tcp": {}}, "Labels": {"com.docker.compose.project": "p"}},
        "State": {"Running": True},
        "NetworkSettings": {
            "Networks": {f"net{i}": {"IPAddress": a, "NetworkID": "n1"} for i, a in enumerate(addresses)}
        },
    }


async def _network(network_id: str) -> dict:
    return {item["Id"]: item for item in STACK}[network_id]


async def test_the_tunnel_refuses_before_it_dials() -> None:
    dialled: list[str] = []

    async def dial(_container: ContainerAt, address: str, _port: int, **_kw: object):
        dialled.append(address)
        raise ConnectionRefusedError

    for address in ("127.0.0.1", "169.254.169.254", "172.21.0.5", "172.20.0.1"):
        refused = await connect_tunnel(ContainerAt(_info(address)), _request(), dial=dial, network=_network)
        assert isinstance(refused, Refusal) and refused.status == 403, refused
        assert "the agent does not dial it" in refused.error
    assert dialled == []
    # a host address beside the container's own: only the container's is dialled
    await connect_tunnel(ContainerAt(_info("127.0.0.1", "172.20.0.5")), _request(), dial=dial, network=_network)
    assert dialled == ["172.20.0.5"]


async def test_a_network_the_engine_cannot_describe_is_none_of_the_stacks() -> None:
    async def gone(_network_id: str) -> dict:
        from gpuhost_agent.runtime.engine.client import EngineError

        raise EngineError("no such network")

    judge = await address_judge(_info("172.20.0.5"), gone)
    assert "outside the networks" in (judge("172.20.0.5") or "")
    assert sandbox_addresses.network_ids(_info("172.20.0.5")) == ["n1"]

"""A rental's container reaches the internet and its own stack, nothing else,
on the real engine with its iptables rules on.

A network namespace of the test's own stands for the world beyond the host:
on one veth it holds 203.0.113.2 (TEST-NET-3, standing for the internet),
169.254.169.254 (the cloud's metadata service) and 10.213.0.2 (a machine of
the host's LAN: another Swarm machine's door, a NAS). A TCP service on the
host's 0.0.0.0 stands for the host's own services (its door included), tried
on the stack network's gateway and on each address of the host. Another
rental's container listens too. From a rental's container deployed by the
agent only the internet stand-in and its own stack's other service answer;
rules taken away by hand are put back by the agent's next check.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from support.stacks import TEST_IMAGE

from gpuhost_agent.core.egress_keeper import EgressKeeper
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.egress_rules import BRIDGE_PREFIX, FORWARD_CHAIN, HOST_CHAIN
from gpuhost_agent.runtime.host_firewall import HostFirewall

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes network namespaces and reads iptables: needs root")

PORT = 7199
INTERNET, METADATA, LAN = "203.0.113.2", "169.254.169.254", "10.213.0.2"
LISTENER = f"""
import socket, threading
def serve(address):
    server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, {PORT})); server.listen(16)
    while True:
        conn, _ = server.accept(); conn.sendall(b"reached-" + address.encode() + b"\\n"); conn.close()
for address in ("{INTERNET}", "{METADATA}", "{LAN}"):
    threading.Thread(target=serve, args=(address,)).start()
"""
STACK = f"""services:
  app:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
  peer:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "while true; do echo reached-peer | nc -l -p {PORT}; done"]
"""


def _sh(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True)


@pytest.fixture
def outside() -> Iterator[None]:
    """The namespace beyond the host, with its three listeners."""
    ns, host_end = f"ghx{os.getpid() % 100000}", f"ghxh{os.getpid() % 100000}"
    _sh("ip", "netns", "add", ns)
    try:
        _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", "out0", "netns", ns)
        for address in ("203.0.113.1/24", "169.254.169.1/24", "10.213.0.1/24"):
            _sh("ip", "addr", "add", address, "dev", host_end)
        _sh("ip", "link", "set", host_end, "up")
        for address in (f"{INTERNET}/24", f"{METADATA}/24", f"{LAN}/24"):
            _sh("ip", "-n", ns, "addr", "add", address, "dev", "out0")
        _sh("ip", "-n", ns, "link", "set", "out0", "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "-n", ns, "route", "add", "default", "via", "203.0.113.1")
        listener = subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-c", LISTENER])
        try:
            for _ in range(100):
                listed = subprocess.run(["ip", "netns", "exec", ns, "ss", "-ltnH"], capture_output=True, text=True)
                if listed.stdout.count(f":{PORT}") == 3:
                    break
                threading.Event().wait(0.1)
            yield
        finally:
            listener.kill()
            listener.wait()
    finally:
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def host_service() -> Iterator[int]:
    """A service of the host's on every address (0.0.0.0): its port."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.sendall(b"reached-host\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


def _host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True)
    return [line.split()[3].split("/")[0] for line in out.stdout.splitlines()]


def _tries(container, targets: list[tuple[str, str, int]]) -> dict[str, str]:
    """name -> what answered ("" for nothing), each tried from inside `container`."""
    script = "".join(
        f'echo "{name}=$(nc -w 3 {address} {port} </dev/null 2>/dev/null | head -c 40)"; '
        for name, address, port in targets
    )
    output = container.exec_run(["sh", "-c", script]).output.decode()
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


async def test_a_rentals_container_reaches_the_internet_and_its_stack_and_nothing_else(
    local_market, docker_client, outside, host_service
) -> None:
    renter, parts, _local = local_market
    rentals = [await renter.rental(), await renter.rental()]
    stacks = [await renter.stack(rental, STACK) for rental in rentals]
    for rental, stack in zip(rentals, stacks, strict=True):
        await renter.wait_stack(rental, stack, (wire.APPLIED,), timeout=60)

    def containers(rental: str) -> dict:
        found = docker_client.containers.list(filters={"label": f"{wire.LABEL_RENTAL}={rental}"})
        return {container.labels["com.docker.compose.service"]: container for container in found}

    mine, theirs = await asyncio.to_thread(containers, rentals[0]), await asyncio.to_thread(containers, rentals[1])
    network = next(iter(mine["app"].attrs["NetworkSettings"]["Networks"].values()))
    bridge = (await asyncio.to_thread(docker_client.networks.get, network["NetworkID"])).attrs["Options"]
    assert bridge["com.docker.network.bridge.name"].startswith(BRIDGE_PREFIX), bridge
    other_peer = next(iter(theirs["peer"].attrs["NetworkSettings"]["Networks"].values()))["IPAddress"]
    targets = [
        ("internet", INTERNET, PORT),
        ("own-stack", "peer", PORT),
        ("metadata", METADATA, PORT),
        ("lan", LAN, PORT),
        ("gateway", network["Gateway"], host_service),
        ("other-rental", other_peer, PORT),
        *((f"host-{address}", address, host_service) for address in await asyncio.to_thread(_host_addresses)),
    ]
    reached = await asyncio.to_thread(_tries, mine["app"], targets)
    assert reached.pop("internet") == f"reached-{INTERNET}", reached
    assert reached.pop("own-stack") == "reached-peer", reached
    assert set(reached.values()) == {""}, reached

    # Taken away by hand: the agent's next check puts the rules back, and says so.
    keeper = parts.agent.egress
    assert isinstance(keeper, EgressKeeper)
    await asyncio.to_thread(HostFirewall().remove)
    assert (await asyncio.to_thread(_tries, mine["app"], [("metadata", METADATA, PORT)]))["metadata"]
    await keeper.run_once()
    assert (await asyncio.to_thread(_tries, mine["app"], [("metadata", METADATA, PORT)]))["metadata"] == ""
    assert "169.254.0.0/16" in await asyncio.to_thread(_listed, FORWARD_CHAIN)
    assert HOST_CHAIN in await asyncio.to_thread(_listed, "INPUT")


def _listed(chain: str) -> str:
    return subprocess.run(["iptables", "-S", chain], capture_output=True, text=True).stdout


async def test_a_network_of_a_stack_deployed_before_the_rules_is_named_and_fails_compliance(docker_client) -> None:
    """A stack deployed by an agent older than the rules kept its br- bridge, outside
    them, until deployed again: the probe names its network, and compliance says so."""
    from gpuhost_agent.inventory import compliance, host_probe
    from gpuhost_agent.runtime.engine.client import DockerEngine

    name = f"gpuhost-legacy-{os.getpid()}"
    labels = {wire.LABEL_MANAGED: "true"}
    legacy = await asyncio.to_thread(docker_client.networks.create, name, driver="bridge", labels=labels)
    engine = DockerEngine()
    try:
        facts = await host_probe.probe_host(engine, None)
        assert name in facts["egress"]["unconfinedNetworks"]
        confined = {**facts["egress"], "confined": True, "differs": None, "error": None}  # the rules themselves held
        check = compliance._egress_check(confined)  # noqa: SLF001
        assert not check.ok and name in check.summary and "deploy those stacks again" in check.remedy
        await asyncio.to_thread(legacy.remove)
        after = await host_probe.probe_host(engine, None)
        assert name not in (after["egress"]["unconfinedNetworks"] or [])
    finally:
        await engine.close()
        await asyncio.to_thread(lambda: [network.remove() for network in docker_client.networks.list(names=[name])])


def test_a_host_without_ip6tables_still_gets_its_ipv4_rules_and_is_said_not_confined(tmp_path) -> None:
    """ip6tables missing used to stop every rule, IPv4's too: now IPv4's are written and the
    IPv6 gap is what compliance says.
    In a network namespace of the test's own, with a PATH that lacks ip6tables."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("iptables", "iptables-restore"):
        (tools / tool).symlink_to(subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip())
    program = (
        "import asyncio, json\n"
        "from gpuhost_agent.core.egress_keeper import EgressKeeper\n"
        "from gpuhost_agent.runtime.host_firewall import HostFirewall\n"
        f"firewall = HostFirewall(path={str(tools)!r})\n"
        "asyncio.run(EgressKeeper(firewall, ()).run_once())\n"
        "import subprocess\n"
        "written = subprocess.run(['iptables', '-S', 'GPUHOST-EGRESS'], capture_output=True, text=True).stdout\n"
        "print(json.dumps({**firewall.facts(()), 'written': written}))\n"
    )
    command = ["unshare", "--net", sys.executable, "-c", program]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert "-A GPUHOST-EGRESS -d 169.254.0.0/16 -j REJECT" in facts["written"], facts  # IPv4's rules are in place
    assert facts["confined"] is False and facts["differs"] is None, facts
    assert (
        facts["error"]
        == "ip6tables is not installed: a rental's containers can reach the host over IPv6 (apt install iptables)"
    )
    assert "egress_not_confined" in done.stdout + done.stderr  # and the agent said so

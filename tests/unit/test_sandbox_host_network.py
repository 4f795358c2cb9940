"""What the host's engine does on its own network for a renter:
no image from a registry at an address of the host or a special address,
unless the host allows that registry; a bounded number of published ports
per stack. core/sandbox/host_network.py; the corpus files 160-169 and
tests/integration/test_registry_ssrf_engine.py hold the same on the real
Compose and engine."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from gpuhost_agent.core.sandbox.context import Registries
from gpuhost_agent.core.sandbox.host_network import (
    MAX_PUBLISHED_PORTS,
    image_problem,
    image_problems,
    published_ports_problem,
    registry_of,
    resolve_registries,
)
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.service import config

HOST = (ipaddress.ip_network("192.0.2.10/32"), ipaddress.ip_network("2001:db8::10/128"))
TESTS = Registries(allowed=("127.0.0.1:5000",), host=HOST)


@pytest.mark.parametrize(
    "image, registry",
    [
        ("alpine", None),
        ("library/alpine:3", None),
        ("renter/app:1", None),
        ("ghcr.io/x/y:1", "ghcr.io"),
        ("localhost/x", "localhost"),
        ("LocalHost/x", "LocalHost"),
        ("127.0.0.1:18777/any/path:tag", "127.0.0.1:18777"),
        ("[::1]:5000/x@sha256:" + "0" * 64, "[::1]:5000"),
        ("myhost:8080/x", "myhost:8080"),
    ],
)
def test_the_registry_is_split_as_the_engine_splits_it(image, registry):
    assert registry_of(image) == registry


@pytest.mark.parametrize(
    "image, why",
    [
        ("127.0.0.1:18777/internal/anything:tag", "loopback"),
        ("127.0.0.1/x:1", "loopback"),
        ("127.0.0.1.:80/x", "loopback"),
        ("127.9.9.9:80/x", "loopback"),
        ("127.1:18777/x", "loopback"),
        ("2130706433:80/x", "loopback"),
        ("0x7f000001:80/x", "loopback"),
        ("0177.0.0.1:80/x", "loopback"),
        ("127.0.0.1:5001/x", "loopback"),  # the allowed registry is one port
        ("localhost/x", "localhost"),
        ("localhost:5000/x", "localhost"),
        ("LOCALHOST:2375/x", "localhost"),
        ("registry.localhost/x", "localhost"),
        ("[::1]/x", "loopback"),
        ("[::1]:8080/x", "loopback"),
        ("[0:0:0:0:0:0:0:1]:8080/x", "loopback"),
        ("[::ffff:127.0.0.1]:80/x", "loopback"),
        ("[::ffff:7f00:1]:80/x", "loopback"),
        ("169.254.169.254/latest/meta-data:1", "link-local"),
        ("169.254.169.254:80/x", "link-local"),
        ("[fe80::1]:80/x", "link-local"),
        ("[::ffff:169.254.169.254]/x", "link-local"),
        ("0.0.0.0:80/x", "unspecified"),
        ("0:80/x", "unspecified"),
        ("[::]:80/x", "not one host's address"),
        ("224.0.0.1/x", "not one host's address"),
        ("[ff02::1]:80/x", "not one host's address"),
        ("192.0.2.10:8080/x", "an address of this host"),
        ("192.0.2.10/x", "an address of this host"),
        ("[2001:db8::10]:443/x", "an address of this host"),
        # What a rental's containers may not reach either (runtime/egress_rules.py)
        ("10.0.0.5:5000/x", "private"),  # a LAN, or the host's bridges: other rentals' containers
        ("172.18.0.2:5000/x", "private"),
        ("100.100.100.200/x", "private"),  # Alibaba Cloud's metadata service (carrier-grade NAT space)
        ("168.63.129.16/x", "private"),  # Azure's WireServer
        ("[fd00:ec2::254]/x", "private"),  # AWS's metadata service over IPv6
    ],
)
def test_a_registry_at_the_host_or_a_special_address_is_refused(image, why):
    problem = image_problem(image, TESTS)
    assert problem is not None and why in problem, problem
    assert repr(image) in problem and "GPUHOST_ALLOWED_REGISTRIES" in problem


@pytest.mark.parametrize(
    "image",
    [
        "alpine",
        "ghcr.io/x/y:1",
        "nvcr.io/nim/meta/llama3-8b-instruct:1.0.3",
        "192.0.2.11:8080/x",
        "registry.gpuhost-test.invalid/nothing/here:1",
        "127.0.0.1:5000/gpuhost-test/busybox:1",  # allowed by the host
    ],
)
def test_other_registries_and_the_allowed_one_pass(image):
    assert image_problem(image, TESTS) is None


def test_a_private_registry_the_operator_opened_passes():
    """GPUHOST_EGRESS_ALLOW opens a network to a rental's containers: a registry mirror there may be pulled from."""
    import ipaddress

    opened = Registries(host=HOST, opened=(ipaddress.ip_network("10.0.8.0/24"),))
    assert image_problem("10.0.8.5:5000/x", opened) is None
    assert "private" in (image_problem("10.0.9.5:5000/x", opened) or "")


def test_the_allowed_list_takes_host_or_host_and_port():
    allowed = Registries(allowed=("[::1]", "LocalHost:5000"))
    assert image_problem("[::1]:5000/x", allowed) is None and image_problem("[::1]/x", allowed) is None
    assert image_problem("localhost:5000/x", allowed) is None
    assert image_problem("localhost:5001/x", allowed) is not None and image_problem("localhost/x", allowed) is not None
    assert image_problem("[::1]/x", Registries()) is not None


def test_a_name_is_judged_by_the_addresses_it_resolved_to():
    resolved = {
        "evil.example": ("93.184.216.34", "127.0.0.1"),
        "meta.example": ("fe80::1%eth0",),
        "self.example": ("192.0.2.10",),
        "fine.example": ("93.184.216.34", "2606:2800:220:1::1"),
        "late.example": None,
        "gone.example": (),
    }
    registries = Registries(host=HOST, resolved=resolved)
    assert "resolves to 127.0.0.1, a loopback address" in str(image_problem("evil.example/x", registries))
    assert "link-local" in str(image_problem("meta.example:443/x", registries))
    assert "an address of this host" in str(image_problem("Self.Example/x", registries))
    assert "did not resolve in time" in str(image_problem("late.example/x", registries))
    assert image_problem("fine.example/x", registries) is None and image_problem("gone.example/x", registries) is None


def test_the_refusal_names_the_service_and_the_image():
    model = {"services": {"ok": {"image": "alpine"}, "bad": {"image": "127.0.0.1:18777/x:1"}, "none": {}}}
    (problem,) = image_problems(model, TESTS)
    assert problem.startswith(
        "service \"bad\": image '127.0.0.1:18777/x:1' is not allowed: its registry '127.0.0.1:18777'"
    )


async def test_names_are_resolved_once_and_only_where_the_engine_would_ask():
    asked: list[str] = []

    async def lookup(name: str) -> list[str]:
        asked.append(name)
        if name == "slow.example":
            await asyncio.sleep(10)
        if name == "none.example":
            raise OSError("no such name")
        return ["127.0.0.1"]

    async def absent(images: list[str]) -> list[str]:
        return [image for image in images if "present" not in image]

    images = [
        "alpine",  # Docker Hub: nothing the renter chose
        "a.example/missing:1",
        "a.example/other-missing:1",  # the same name, looked up once
        "b.example/present:1",  # the engine has it: its registry is never asked
        "c.example/present:1",
        "none.example/x",
        "slow.example/x",
        "127.0.0.1:9/x",  # literals and localhost are judged without a lookup
        "localhost/x",
        "x.invalid/y",
        "allowed.example:5000/x",
    ]
    services = {f"s{i}": {"image": image} for i, image in enumerate(images)}
    services["always"] = {"image": "c.example/present:1", "pull_policy": "always"}
    services["never"] = {"image": "d.example/missing:1", "pull_policy": "never"}
    found = await resolve_registries({"services": services}, ("allowed.example:5000",), absent, lookup, timeout=0.2)
    assert sorted(asked) == ["a.example", "c.example", "none.example", "slow.example"]
    assert found == {"a.example": ("127.0.0.1",), "c.example": ("127.0.0.1",), "none.example": (), "slow.example": None}


def _ports(count: int, replicas: int | None = None) -> dict:
    service: dict = {"image": "x", "ports": [{"target": 8000 + i, "protocol": "tcp"} for i in range(count)]}
    if replicas is not None:
        service["deploy"] = {"replicas": replicas}
    return service


def test_published_ports_are_bounded_per_stack_replicas_counted():
    assert published_ports_problem({"services": {"a": _ports(MAX_PUBLISHED_PORTS)}}) is None
    assert published_ports_problem({"services": {"a": _ports(32), "b": _ports(16, replicas=2)}}) is None
    problem = published_ports_problem({"services": {"a": _ports(20000)}})
    assert (
        problem is not None and "publish 20000 ports" in problem and f"the {MAX_PUBLISHED_PORTS} one stack" in problem
    )
    problem = str(published_ports_problem({"services": {"a": _ports(10, replicas=8), "b": {"image": "x"}}}))
    assert 'publish 80 ports (service "a" 80)' in problem


def test_the_host_names_its_local_registries_in_the_configuration():
    environ = {"GPUHOST_ALLOWED_REGISTRIES": " 127.0.0.1:5000, [::1]:5000 ,Registry.Local "}
    assert config.load({}, environ=environ).allowed_registries == ("127.0.0.1:5000", "[::1]:5000", "registry.local")
    assert config.load({}, environ={}).allowed_registries == ()
    for bad in ("127.0.0.1:5000/x", "::1:5000", "a b"):
        with pytest.raises(config.ConfigError, match="GPUHOST_ALLOWED_REGISTRIES entry"):
            config.load({}, environ={"GPUHOST_ALLOWED_REGISTRIES": bad})


async def test_a_reference_the_engine_cannot_read_does_not_stop_the_judgement():
    async def absent(images: list[str]) -> list[str]:
        raise EngineError("400: invalid reference format")

    async def lookup(name: str) -> list[str]:
        return ["169.254.169.254"]

    found = await resolve_registries({"services": {"a": {"image": "meta.example/x"}}}, (), absent, lookup)
    assert found == {"meta.example": ("169.254.169.254",)}

"""What the host's engine does on its own network for a renter: fetch images
from registries, publish ports. Pure judgement, plus the one name
lookup it needs (resolve_registries).

An image is pulled by dockerd, a root process in the host's network
namespace, and dockerd speaks plain HTTP to a loopback registry. So a
renter's image may not name a registry at the host or at a special address:
`localhost` (and `*.localhost`), a loopback, link-local (169.254/16, where
cloud metadata answers; fe80::/10), unspecified, multicast or reserved
address, or any address of the host's own interfaces (read as the tunnels
read them, streams/tunnel.py), as an IPv4 or bracketed IPv6 literal, in any
spelling the resolver takes (127.1, 0x7f.1, 2130706433), with or without a
port. A name is resolved once, when the engine would contact it, and
refused if any of its addresses is such an address. A name that resolves
elsewhere now and to the host when dockerd asks (DNS rebinding) is not
caught here. The host may allow registries that are local on purpose
(GPUHOST_ALLOWED_REGISTRIES, host[:port]).

Every published port is a docker-proxy process of the host's, outside the
rental's cgroup, holding a port of the host's range all rentals share: one
stack publishes at most MAX_PUBLISHED_PORTS, counted on Compose's model
(where ranges are expanded), each replica's ports counted.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable

from gpuhost_agent.core.sandbox.context import Registries
from gpuhost_agent.core.sandbox.make_safe import replicas_of
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.streams.sandbox_addresses import IPAddress, registry_address_problem

MAX_PUBLISHED_PORTS = 64  # per stack; a rental has at most GPUHOST_STACKS_PER_RENTAL stacks
# Declared (exposed) ports a stack may have, ranges counted port by port: each is
# an entry of its container's Ports in every container list the agent reads and
# sends, and a tunnel; `expose: ["1-65535"]` made one container's entry 7.7 MB
# and 2.7 s of the agent's CPU to shape.
MAX_EXPOSED_PORTS = 256
_EXPOSE = re.compile(r"^(\d+)(?:-(\d+))?(?:/\w+)?$")
RESOLVE_SECONDS = 3.0
SETTING = "GPUHOST_ALLOWED_REGISTRIES"
_NUMERIC = re.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}")
_NO_CONTACT = (None, "", "missing", "if_not_present", "never")  # pull policies that pull only a missing image


def registry_of(image: str) -> str | None:
    """The registry an image reference names, split as the engine splits it
    (distribution/reference: a first component with a `.` or `:`, `localhost`,
    or an upper-case letter); None for Docker Hub."""
    first, sep, _ = image.strip().partition("/")
    if not sep or (not any(c in first for c in ".:") and first != "localhost" and first.lower() == first):
        return None
    return first


def split_host(registry: str) -> tuple[str, str]:
    """(host, port) of `host[:port]` or `[v6][:port]`; the host lower-case, without a trailing dot."""
    if registry.startswith("["):
        host, _, rest = registry[1:].partition("]")
        return host.lower(), rest[1:] if rest.startswith(":") else ""
    host, sep, port = registry.rpartition(":")
    if not (sep and port.isdigit()):
        host, port = registry, ""
    return host.lower().rstrip("."), port


def literal(host: str) -> IPAddress | None:
    """The address a host part spells, in the resolver's spellings too."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if _NUMERIC.fullmatch(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def is_localhost(host: str) -> bool:
    return host == "localhost" or host.endswith(".localhost")


def is_allowed(registry: str, allowed: Iterable[str]) -> bool:
    host, port = split_host(registry)
    return any(h == host and p in ("", port) for h, p in map(split_host, (a.strip() for a in allowed if a.strip())))


def allows(allowed: Iterable[str]) -> Callable[[str, int], bool]:
    """is_allowed for a (host, port) the pull guard is asked for."""
    kept = tuple(allowed)
    return lambda host, port: is_allowed(f"[{host}]:{port}" if ":" in host else f"{host}:{port}", kept)


def image_problem(image: str, registries: Registries) -> str | None:
    """Why the host's engine may not fetch `image`; None when it may."""
    registry = registry_of(image)
    if registry is None or is_allowed(registry, registries.allowed):
        return None
    host, _ = split_host(registry)
    why = None
    if is_localhost(host):
        why = "is this machine (localhost)"
    elif (ip := literal(host)) is not None:
        why = f"is {problem}" if (problem := registry_address_problem(ip, registries.host, registries.opened)) else None
    elif host in registries.resolved:
        addresses = registries.resolved[host]
        if addresses is None:
            why = "did not resolve in time, so where it is cannot be told"
        for address in addresses or ():
            ip = ipaddress.ip_address(address.split("%")[0])
            problem = registry_address_problem(ip, registries.host, registries.opened)
            if problem:
                why = f"resolves to {address}, {problem}"
                break
    if why is None:
        return None
    return (
        f"image {image!r} is not allowed: its registry {registry!r} {why}, and the host's engine would fetch it "
        f"on the host's own network (a registry elsewhere is fine; the host may allow a local one in {SETTING})"
    )


def image_problems(model: dict, registries: Registries) -> list[str]:
    problems = []
    for name, service in (model.get("services") or {}).items():
        image = (service or {}).get("image")
        if isinstance(image, str) and (problem := image_problem(image, registries)):
            problems.append(f'service "{name}": {problem}')
    return problems


def published_ports_problem(model: dict) -> str | None:
    """Why the stack publishes too many ports; None when it does not."""
    counts = {}
    for name, service in (model.get("services") or {}).items():
        ports = (service or {}).get("ports") or []
        if ports:
            counts[name] = len(ports) * max(1, replicas_of(service) or 1)
    total = sum(counts.values())
    if total <= MAX_PUBLISHED_PORTS:
        return None
    each = ", ".join(f'service "{name}" {count}' for name, count in counts.items())
    return (
        f"ports: the stack would publish {total} ports ({each}), more than the {MAX_PUBLISHED_PORTS} one stack may "
        "publish: each is a process of the host's and a port of the host's range, which all rentals share"
    )


def exposed_count(entry: object) -> int:
    """How many ports an `expose:` entry declares ("8080", "8000-8009/udp");
    one that is not a port or a range counts as one (Compose refuses it)."""
    match = _EXPOSE.match(str(entry).strip())
    if not match or not match.group(2):
        return 1
    return max(1, int(match.group(2)) - int(match.group(1)) + 1)


def exposed_ports_problem(model: dict) -> str | None:
    """Why the stack declares too many ports; None when it does not."""
    total = sum(
        sum(exposed_count(entry) for entry in (service or {}).get("expose") or []) * max(1, replicas_of(service) or 1)
        for service in (model.get("services") or {}).values()
    )
    if total <= MAX_EXPOSED_PORTS:
        return None
    return (
        f"expose: the stack would declare {total} ports, more than the {MAX_EXPOSED_PORTS} one stack may: each is "
        "an entry of every container list the agent reads for all renters, and a tunnel"
    )


Lookup = Callable[[str], Awaitable[list[str]]]  # a name -> its addresses (raises OSError when it has none)
Absent = Callable[[list[str]], Awaitable[list[str]]]  # images -> those the engine does not have


async def _getaddrinfo(name: str) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(name, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def resolve_registries(
    model: dict,
    allowed: Iterable[str],
    absent: Absent | None = None,
    lookup: Lookup = _getaddrinfo,
    timeout: float = RESOLVE_SECONDS,
) -> dict[str, tuple[str, ...] | None]:
    """The addresses of each registry name the engine would contact for this
    model (an image it lacks, or a pull policy that always asks), once:
    name -> addresses, () when it does not resolve, None when no answer came
    in time. Literals, `localhost` and `.invalid` names are not looked up."""
    allowed = tuple(allowed)
    images = {
        str(s["image"]): s.get("pull_policy")
        for s in (model.get("services") or {}).values()
        if isinstance(s, dict) and isinstance(s.get("image"), str)
    }
    try:
        missing = set(await absent(sorted(images))) if absent is not None else set(images)
    except EngineError:  # a reference the engine cannot read: the policy or Compose says why
        missing = set(images)
    names = set()
    for image, policy in images.items():
        registry = registry_of(image)
        if registry is None or is_allowed(registry, allowed) or policy == "never":
            continue
        host, _ = split_host(registry)
        if image in missing or policy not in _NO_CONTACT:
            if literal(host) is None and not is_localhost(host) and not host.endswith(".invalid"):
                names.add(host)

    async def one(name: str) -> tuple[str, ...] | None:
        try:
            return tuple(await asyncio.wait_for(lookup(name), timeout))
        except asyncio.TimeoutError:
            return None
        except (OSError, UnicodeError):
            return ()

    found = await asyncio.gather(*(one(name) for name in sorted(names)))
    return dict(zip(sorted(names), found, strict=True))

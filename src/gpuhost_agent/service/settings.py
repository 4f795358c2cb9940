"""What a setting of the agent is, and how the text a host writes becomes its value.

Every setting is declared once, as a `Setting` in service/settings_table.py:
its name (the flag's, and AgentConfig's field unless `fills` says another),
its environment variable (also its key in the config file), its default as a
host would write it, its unit, its help and which modes read it. The reader
(service/config.py), the command line's flags (service/cli.py), the list in
docs/operations.md (service/settings_doc.py) and doctor's view of the
effective settings (service/settings_view.py) are all made from that table,
so none of them can say another default or forget a setting.

The value parsers below turn the text into the typed value and raise
ConfigError with a message that names the variable and an example of what it
takes: a wrong value stops the agent at its start, not at the first deploy.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpuhost_agent.errors import Refusal
from gpuhost_agent.runtime.egress_rules import SETTING as EGRESS_SETTING
from gpuhost_agent.runtime.egress_rules import allowed_networks

DEFAULT_LOCAL_LISTEN = "127.0.0.1:8787"
SWARM_PORT = 7072  # a Swarm worker agent's port for the leader (docs/swarm.md)
DEFAULT_PULL_GUARD = "127.0.0.1:47128"  # dockerd's HTTP(S) proxy (streams/pull_guard.py); install.sh names it


class ConfigError(Refusal, ValueError):
    """A setting is missing or malformed; the message says which and how to fix it."""


class SwarmRole(str, Enum):
    """GPUHOST_SWARM's value (read by swarm_role): the topology the
    composition root builds (service/topology.py); no other part asks it.
    The members are the setting's own strings; the one machine's is falsy."""

    ONE_MACHINE = ""
    LEADER = "leader"
    WORKER = "worker"

    def __str__(self) -> str:
        return str(self.value)


class Mode(str, Enum):
    """Which agents read a setting: docs/operations.md and --help say it."""

    ONE = "one machine"
    LOCAL = "local marketplace"
    LEADER = "Swarm leader"
    WORKER = "Swarm worker"


EVERY = (Mode.ONE, Mode.LOCAL, Mode.LEADER, Mode.WORKER)
DEPLOYING = (Mode.ONE, Mode.LOCAL, Mode.LEADER)  # the agents that run stacks; a worker only serves its leader
MARKETPLACE = (Mode.ONE, Mode.LEADER)
SWARM = (Mode.LEADER, Mode.WORKER)


@dataclass(frozen=True)
class Setting:
    """One setting, declared once. `default` is the text a host would write
    (parsed like theirs, so the doc shows it as they would write it); None
    means unset, or computed where `shown_default` says how."""

    name: str
    env: str
    parse: Callable[[str, str], Any]  # (text, env) -> the value; raises ConfigError
    help: str
    default: str | None = None
    unit: str = ""
    modes: tuple[Mode, ...] = EVERY
    group: str = "general"
    fills: str | None = ""  # the AgentConfig field it fills: "" for `name`, None for none (a source of another)
    secret: bool = False  # never printed: doctor and logs show *** or unset
    in_file: bool = True  # read from the config file as well (not GPUHOST_CONFIG itself)
    shown_default: str | None = None  # the default in words, where it is computed at start
    flag: str = ""  # the command line's flag, when not --<name with dashes>

    @property
    def field(self) -> str | None:
        return self.name if self.fills == "" else self.fills

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def default_text(self) -> str:
        """The default as the doc and --help show it."""
        if self.shown_default is not None:
            return self.shown_default
        if self.default is None:
            return "unset"
        return self.default or "none"

    def value_of(self, text: str | None) -> Any:
        """The typed value of what a host wrote (None: nothing anywhere)."""
        return None if text is None else self.parse(text, self.env)


# The parsers: (text, the variable's name for the message) -> value.


def text(value: str, _env: str) -> str:
    return value


def path(value: str, _env: str) -> Path:
    return Path(value)


def absolute_path(value: str, _env: str) -> Path:
    return Path(value).absolute()


def integer(value: str, _env: str) -> int:
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"bad number in the configuration: {exc}") from None


def seconds(value: str, _env: str) -> float:
    try:
        return float(value)
    except ValueError as exc:
        raise ConfigError(f"bad number in the configuration: {exc}") from None


def at_least_one_second(value: str, env: str) -> float:
    """An interval of periodic work: never below a second, whatever is written."""
    return max(1.0, seconds(value, env))


def at_least_one(value: str, env: str) -> int:
    number = integer(value, env)
    if number < 1:
        raise ConfigError(f"{env} must be at least 1, not {number}")
    return number


def parse_listen(value: str, _env: str = "") -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address {value!r} must be HOST:PORT, e.g. {DEFAULT_LOCAL_LISTEN}")
    return host.strip("[]") or "127.0.0.1", int(port)


def on_off(value: str, env: str) -> bool:
    """A switch: on/off, true/false, yes/no or 1/0, in any case."""
    word = value.strip().lower()
    if word not in ("on", "off", "true", "false", "yes", "no", "1", "0"):
        raise ConfigError(f"{env} must be on or off, not {word!r}")
    return word in ("on", "true", "yes", "1")


def upgrades_mode(value: str, env: str) -> str:
    """GPUHOST_UPGRADES: off, or offered (the marketplace's signed offers are taken)."""
    word = value.strip().lower()
    if word not in ("off", "offered"):
        raise ConfigError(f"{env} must be off or offered, not {word!r}")
    return word


def pull_guard(value: str, env: str) -> tuple[str, int] | None:
    """GPUHOST_PULL_GUARD: off, or the loopback address the guard dockerd's
    pulls go through listens on (never another: renters' containers reach
    none of the host's loopback, and the host's other addresses are theirs to try)."""
    if value.strip().lower() == "off":
        return None
    host, port = parse_listen(value.strip(), env)
    try:
        loopback = ipaddress.ip_address(host).is_loopback and port > 0
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(f"{env} {value!r} must be a loopback ADDRESS:PORT such as {DEFAULT_PULL_GUARD}, or off")
    return host, port


def proxy_url(value: str, env: str) -> tuple[str, int]:
    """An operator's HTTP proxy, http://HOST:PORT (no credentials: they would be in every process listing)."""
    url = urlsplit(value.strip())
    if url.scheme != "http" or not url.hostname or url.username or url.path not in ("", "/") or url.query:
        raise ConfigError(f"{env} {value!r} must be an HTTP proxy's URL, http://HOST:PORT")
    try:
        port = url.port or 80
    except ValueError:
        raise ConfigError(f"{env} {value!r} has a port out of range") from None
    return url.hostname, port


def log_size(value: str, env: str) -> str:
    """Docker's size syntax for `max-size` (`50m`, `1g`, `200k`), checked here:
    a value Docker refuses would fail every deploy instead of the start."""
    if not re.fullmatch(r"[1-9][0-9]*[kmg]", value.strip().lower()):
        raise ConfigError(f"{env} {value!r} must be a size such as 50m, 1g or 200k")
    return value.strip().lower()


def size_bytes(value: str, env: str) -> int:
    """`20g`, `500m`, `0` (no floor): a size in bytes, 1024-based like Docker's."""
    match = re.fullmatch(r"(\d+)([kmgt]?)", value.strip().lower())
    if not match:
        raise ConfigError(f"{env} {value!r} must be a size such as 20g, 500m or 0")
    return int(match.group(1)) * 1024 ** " kmgt".index(match.group(2) or " ")


def marketplace_url(value: str, env: str) -> str:
    """https://HOST/.../v1; plain http only for this machine itself: every
    request carries the environment's API key, and an offered release is
    code the host runs as root, so neither crosses a network in clear."""
    url = value.rstrip("/")
    if not url.startswith(("http://", "https://")) or not url.endswith("/v1"):
        raise ConfigError(f"marketplace URL {url!r} must be http(s)://HOST/.../v1")
    if url.startswith("http://") and not _is_loopback(urlsplit(url).hostname or ""):
        raise ConfigError(
            f"{env} {url!r} must be https://: the API key goes with every request, and plain http is "
            "only for a marketplace on this machine (127.0.0.1, ::1, localhost)"
        )
    return url


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def swarm_role(value: str, env: str) -> SwarmRole:
    word = value.strip().lower()
    if word not in ("", "off", "leader", "worker"):
        raise ConfigError(f"{env} must be leader or worker (or off, for one machine), not {word!r}")
    return SwarmRole("" if word == "off" else word)


def swarm_listen(value: str, env: str) -> tuple[str, int]:
    """A worker's door on one address of this machine, by default its Swarm
    address (asked of the engine at start, host ""), never every address: a
    wildcard would serve the door on the bridges renters' containers sit on."""
    if not value.strip():
        return "", SWARM_PORT
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{env} {value!r} must be ADDRESS:PORT (or :PORT for the Swarm address)")
    host = host.strip("[]")
    if not host:
        return "", int(port)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{env} {value!r}: the address must be an IP address of this machine") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_unspecified:
        raise ConfigError(f"{env} {value!r}: one address, not every one (the default is the Swarm address)")
    return host, int(port)


def swarm_workers(value: str, env: str) -> dict[str, tuple[str, int]]:
    """<node id>=<host>:<port>,...: where the leader finds a worker's agent
    when not at the node's own Swarm address."""
    found = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        node, _, address = item.partition("=")
        if not node or not address:
            raise ConfigError(f"{env} entry {item!r} must be <node id>=<host>:<port>")
        found[node.strip()] = parse_listen(address.strip())
    return found


def egress_networks(value: str, env: str) -> tuple[str, ...]:
    """Comma-separated IPv4 addresses or networks a rental's containers may reach
    beyond the internet (runtime/egress_rules.py)."""
    networks, problems = allowed_networks(value)
    if problems:
        raise ConfigError(problems[0].replace(EGRESS_SETTING, env, 1))
    return networks


def registries(value: str, env: str) -> tuple[str, ...]:
    """Comma-separated host[:port] ([v6]:port), as image references spell them."""
    entries = tuple(part.strip().lower() for part in value.split(",") if part.strip())
    for entry in entries:
        if "/" in entry or " " in entry or entry.count(":") > 1 and not entry.startswith("["):
            raise ConfigError(f"{env} entry {entry!r} must be host[:port], e.g. 127.0.0.1:5000")
    return entries

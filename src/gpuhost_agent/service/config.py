"""Where the agent's settings come from, in rising priority: defaults, the
config file (/etc/gpuhost-agent/agent.conf), environment variables, flags.

The config file uses the same KEY=VALUE names as the environment, so systemd's
EnvironmentFile= and a hand-edited file say the same thing. The API key is best
kept in its own root-only file named by GPUHOST_API_KEY_FILE.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_FILE = Path("/etc/gpuhost-agent/agent.conf")
DEFAULT_LOCAL_LISTEN = "127.0.0.1:8787"
SWARM_PORT = 7072  # a Swarm worker agent's port for the leader (docs/swarm.md)
SWARM_TLS_DIR = Path("/etc/gpuhost-agent/swarm-tls")  # the machine's certificate for the Swarm (service/swarm_tls.py)


class ConfigError(ValueError):
    """A setting is missing or malformed; the message says which and how to fix it."""


@dataclass
class AgentConfig:
    marketplace_url: str | None
    env_id: str | None
    api_key: str | None
    state_dir: Path
    local_listen: tuple[str, int]
    local_api_key: str | None
    log_level: str
    compose_command: str | None
    settle_seconds: float
    stop_timeout: int
    nvml_library: str | None = None  # full path, when libnvidia-ml.so.1 is not on the loader's path
    location: str | None = None  # what the listing shows as location, e.g. "DE-Frankfurt"
    gpu_check_image: str | None = None  # a local image to start with --gpus all as the GPU container check
    toolkit_config: Path | None = None  # the NVIDIA Container Toolkit's config.toml
    speed_max_bytes: int = 25_000_000  # per direction, for the network speed test
    speed_max_seconds: float = 10.0
    publish_address: str | None = None  # host address renters' ports are published on (default: 0.0.0.0,
    # 127.0.0.1 with the local marketplace)
    pids_limit: int = 4096  # processes per container
    log_max_size: str = "50m"  # each container's log file, before Docker rotates it
    log_max_files: int = 3  # rotated files kept per container (the cap is size x files)
    disk_floor_bytes: int = 20 * 1024**3  # free space on Docker's disk below which no stack is deployed
    rental_disk_bytes: int | None = None  # one rental's disk, when the host fixes it (else by GPUs)
    disk_watch_seconds: float = 60.0  # how often each rental's disk use is measured
    stacks_per_rental: int = 16  # stacks one rental may have on this host (each makes networks)
    deploy_concurrency: int = 8  # deploys run at once; the others wait, APPLYING, for their turn
    usage_seconds: float = 60.0  # how often GPU usage is counted (also at every assignment and release)
    reconcile_grace_seconds: float = 120.0  # how long a stack the marketplace does not list may stay
    shutdown_grace_seconds: float = 20.0  # on SIGTERM, how long running jobs may take before they are abandoned
    status_socket: Path | None = None  # Unix socket for `gpuhost-agent status` (default <state_dir>/agent.sock)
    metrics: bool = False  # GPUHOST_METRICS=on: /metrics on the status socket
    metrics_listen: tuple[str, int] | None = None  # GPUHOST_METRICS_LISTEN=127.0.0.1:9464: also on loopback TCP
    swarm: str = ""  # GPUHOST_SWARM=leader: this agent deploys to the Swarm its engine manages (docs/swarm.md)
    # ... =worker: it serves the leader what only this machine's engine can (streams/node_proxy.py)
    swarm_key: str | None = None  # GPUHOST_SWARM_KEY: the environment's key, the same on the leader and workers
    swarm_listen: tuple[str, int] = ("", SWARM_PORT)  # a worker's address for the leader ("": its Swarm address)
    swarm_workers: dict[str, tuple[str, int]] = field(default_factory=dict)  # the leader's: node id -> worker
    swarm_tls_dir: Path = SWARM_TLS_DIR  # GPUHOST_SWARM_TLS_DIR: the leader's or worker's TLS files (install.sh)
    swarm_encrypted: bool = False  # GPUHOST_SWARM_ENCRYPTED=on: the stacks' overlays are encrypted (IPsec)
    allowed_registries: tuple[str, ...] = ()  # GPUHOST_ALLOWED_REGISTRIES: host[:port] of local registries renters
    # may pull from (else no image may come from the host's own or a special address: core/sandbox_host_network.py)

    @property
    def socket_path(self) -> Path:
        """The status socket: as configured, else in the state directory."""
        return self.status_socket or self.state_dir / "agent.sock"

    @property
    def uses_local_marketplace(self) -> bool:
        return not self.marketplace_url


def read_config_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"{path}:{number}: expected KEY=VALUE")
        values[key.strip()] = value.strip().strip('"').strip("'")
    return values


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address {text!r} must be HOST:PORT, e.g. {DEFAULT_LOCAL_LISTEN}")
    return host.strip("[]") or "127.0.0.1", int(port)


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/gpuhost-agent")
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "gpuhost-agent"


def _read_key(path: object, what: str) -> str | None:
    """A key kept in its own root-only file (install.sh writes them so)."""
    if not path:
        return None
    try:
        return Path(str(path)).read_text().strip() or None
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} key file {path}: {exc.strerror}") from None


def load(flags: dict[str, object], environ: dict[str, str] | None = None) -> AgentConfig:
    """Merge the sources; flags holds only what was given on the command line."""
    environ = dict(os.environ if environ is None else environ)
    config_path = Path(str(flags.get("config") or environ.get("GPUHOST_CONFIG") or DEFAULT_CONFIG_FILE))
    file_values: dict[str, str] = {}
    if config_path.exists():
        file_values = read_config_file(config_path)
    elif flags.get("config") or environ.get("GPUHOST_CONFIG"):
        raise ConfigError(f"config file {config_path} does not exist")

    def pick(flag: str, key: str, default: Any = None) -> Any:
        value = flags.get(flag)
        if value not in (None, ""):
            return value
        return environ.get(key) or file_values.get(key) or default

    api_key = pick("api_key", "GPUHOST_API_KEY") or _read_key(pick("api_key_file", "GPUHOST_API_KEY_FILE"), "API")
    url = pick("marketplace_url", "GPUHOST_MARKETPLACE_URL")
    env_id = pick("env_id", "GPUHOST_ENV_ID")
    if url:
        url = str(url).rstrip("/")
        if not url.startswith(("http://", "https://")) or not url.endswith("/v1"):
            raise ConfigError(f"marketplace URL {url!r} must be http(s)://HOST/.../v1")
        missing = [
            name
            for name, value in (("GPUHOST_ENV_ID / --env-id", env_id), ("GPUHOST_API_KEY / --api-key", api_key))
            if not value
        ]
        if missing:
            raise ConfigError(f"with a marketplace URL the agent also needs {' and '.join(missing)}")
    try:
        settle = float(pick("settle_seconds", "GPUHOST_SETTLE_SECONDS", 3.0))
        stop_timeout = int(pick("stop_timeout", "GPUHOST_STOP_TIMEOUT", 10))
        speed_max_bytes = int(pick("speed_max_bytes", "GPUHOST_SPEEDTEST_MAX_BYTES", 25_000_000))
        speed_max_seconds = float(pick("speed_max_seconds", "GPUHOST_SPEEDTEST_MAX_SECONDS", 10.0))
        pids_limit = int(pick("pids_limit", "GPUHOST_PIDS_LIMIT", 4096))
        log_max_size = str(pick("log_max_size", "GPUHOST_LOG_MAX_SIZE", "50m"))
        log_max_files = int(pick("log_max_files", "GPUHOST_LOG_MAX_FILES", 3))
        disk_floor = str(pick("disk_floor", "GPUHOST_DISK_FLOOR", "20g"))
        rental_disk = str(pick("rental_disk", "GPUHOST_RENTAL_DISK", "") or "")
        disk_watch = float(pick("disk_watch_seconds", "GPUHOST_DISK_WATCH_SECONDS", 60.0))
        usage_every = float(pick("usage_seconds", "GPUHOST_USAGE_SECONDS", 60.0))
        stacks_per_rental = int(pick("stacks_per_rental", "GPUHOST_STACKS_PER_RENTAL", 16))
        deploy_concurrency = int(pick("deploy_concurrency", "GPUHOST_DEPLOY_CONCURRENCY", 8))
        grace = float(pick("reconcile_grace_seconds", "GPUHOST_RECONCILE_GRACE_SECONDS", 120.0))
        shutdown_grace = float(pick("shutdown_grace_seconds", "GPUHOST_SHUTDOWN_GRACE_SECONDS", 20.0))
    except ValueError as exc:
        raise ConfigError(f"bad number in the configuration: {exc}") from None
    state_dir = Path(str(pick("state_dir", "GPUHOST_STATE_DIR", default_state_dir()))).absolute()
    status_socket = Path(str(pick("status_socket", "GPUHOST_STATUS_SOCKET", state_dir / "agent.sock"))).absolute()
    metrics_on = _on_off(str(pick("metrics", "GPUHOST_METRICS", "off")), "GPUHOST_METRICS")
    metrics_listen = pick("metrics_listen", "GPUHOST_METRICS_LISTEN")
    swarm = str(pick("swarm", "GPUHOST_SWARM", "") or "").strip().lower()
    if swarm not in ("", "off", "leader", "worker"):
        raise ConfigError(f"GPUHOST_SWARM must be leader or worker (or off, for one machine), not {swarm!r}")
    swarm_key = pick("swarm_key", "GPUHOST_SWARM_KEY") or _read_key(pick("", "GPUHOST_SWARM_KEY_FILE"), "environment's")
    if swarm == "worker" and not swarm_key:
        raise ConfigError(
            "GPUHOST_SWARM=worker needs GPUHOST_SWARM_KEY or GPUHOST_SWARM_KEY_FILE, "
            "the environment's key (the leader's too)"
        )
    if swarm_key and len(str(swarm_key)) < 16:
        raise ConfigError("GPUHOST_SWARM_KEY must have at least 16 characters (e.g. `openssl rand -hex 24`)")
    return AgentConfig(
        marketplace_url=url,
        env_id=env_id,
        api_key=api_key,
        state_dir=state_dir,
        local_listen=parse_listen(str(pick("local_listen", "GPUHOST_LOCAL_LISTEN", DEFAULT_LOCAL_LISTEN))),
        local_api_key=pick("local_api_key", "GPUHOST_LOCAL_API_KEY"),
        log_level=str(pick("log_level", "GPUHOST_LOG_LEVEL", "info")),
        compose_command=pick("compose_command", "GPUHOST_COMPOSE_COMMAND"),
        settle_seconds=settle,
        stop_timeout=stop_timeout,
        nvml_library=pick("nvml_library", "GPUHOST_NVML_LIBRARY"),
        location=pick("location", "GPUHOST_LOCATION"),
        gpu_check_image=pick("gpu_check_image", "GPUHOST_GPU_CHECK_IMAGE"),
        toolkit_config=Path(str(toolkit)) if (toolkit := pick("toolkit_config", "GPUHOST_TOOLKIT_CONFIG")) else None,
        speed_max_bytes=speed_max_bytes,
        speed_max_seconds=speed_max_seconds,
        publish_address=pick("publish_address", "GPUHOST_PUBLISH_ADDRESS"),
        pids_limit=pids_limit,
        log_max_size=_log_size(log_max_size),
        log_max_files=_at_least_one(log_max_files, "GPUHOST_LOG_MAX_FILES"),
        disk_floor_bytes=_size_bytes(disk_floor, "GPUHOST_DISK_FLOOR"),
        rental_disk_bytes=_size_bytes(rental_disk, "GPUHOST_RENTAL_DISK") if rental_disk else None,
        disk_watch_seconds=max(1.0, disk_watch),
        usage_seconds=max(1.0, usage_every),
        stacks_per_rental=_at_least_one(stacks_per_rental, "GPUHOST_STACKS_PER_RENTAL"),
        deploy_concurrency=_at_least_one(deploy_concurrency, "GPUHOST_DEPLOY_CONCURRENCY"),
        reconcile_grace_seconds=grace,
        shutdown_grace_seconds=shutdown_grace,
        status_socket=status_socket,
        metrics=metrics_on,
        metrics_listen=parse_listen(str(metrics_listen)) if metrics_listen else None,
        swarm="" if swarm == "off" else swarm,
        swarm_key=str(swarm_key) if swarm_key else None,
        swarm_listen=_swarm_listen(str(pick("swarm_listen", "GPUHOST_SWARM_LISTEN", "") or "")),
        swarm_tls_dir=Path(str(pick("swarm_tls_dir", "GPUHOST_SWARM_TLS_DIR", SWARM_TLS_DIR))).absolute(),
        swarm_workers=_workers(str(pick("swarm_workers", "GPUHOST_SWARM_WORKERS", "") or "")),
        swarm_encrypted=_on_off(
            str(pick("swarm_encrypted", "GPUHOST_SWARM_ENCRYPTED", "off")), "GPUHOST_SWARM_ENCRYPTED"
        ),
        allowed_registries=_registries(str(pick("allowed_registries", "GPUHOST_ALLOWED_REGISTRIES", "") or "")),
    )


def _log_size(text: str) -> str:
    """Docker's size syntax for `max-size` (`50m`, `1g`, `200k`), checked here:
    a value Docker refuses would fail every deploy instead of the start."""
    if not re.fullmatch(r"[1-9][0-9]*[kmg]", text.strip().lower()):
        raise ConfigError(f"GPUHOST_LOG_MAX_SIZE {text!r} must be a size such as 50m, 1g or 200k")
    return text.strip().lower()


def _size_bytes(text: str, name: str) -> int:
    """`20g`, `500m`, `0` (no floor): a size in bytes, 1024-based like Docker's."""
    match = re.fullmatch(r"(\d+)([kmgt]?)", text.strip().lower())
    if not match:
        raise ConfigError(f"{name} {text!r} must be a size such as 20g, 500m or 0")
    return int(match.group(1)) * 1024 ** " kmgt".index(match.group(2) or " ")


def _on_off(text: str, name: str) -> bool:
    """A switch: on/off, true/false, yes/no or 1/0, in any case."""
    value = text.strip().lower()
    if value not in ("on", "off", "true", "false", "yes", "no", "1", "0"):
        raise ConfigError(f"{name} must be on or off, not {value!r}")
    return value in ("on", "true", "yes", "1")


def _swarm_listen(text: str) -> tuple[str, int]:
    """GPUHOST_SWARM_LISTEN: the worker's door on one address of this machine,
    by default its Swarm address (asked of the engine at start, host ""),
    never every address: a wildcard would serve the door on the bridges
    renters' containers sit on."""
    if not text.strip():
        return "", SWARM_PORT
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"GPUHOST_SWARM_LISTEN {text!r} must be ADDRESS:PORT (or :PORT for the Swarm address)")
    host = host.strip("[]")
    if not host:
        return "", int(port)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"GPUHOST_SWARM_LISTEN {text!r}: the address must be an IP address of this machine") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_unspecified:
        raise ConfigError(
            f"GPUHOST_SWARM_LISTEN {text!r}: one address, not every one (the default is the Swarm address)"
        )
    return host, int(port)


def _workers(text: str) -> dict[str, tuple[str, int]]:
    """GPUHOST_SWARM_WORKERS=<node id>=<host>:<port>,...: where the leader finds
    a worker's agent when not at the node's own Swarm address."""
    found = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        node, _, address = item.partition("=")
        if not node or not address:
            raise ConfigError(f"GPUHOST_SWARM_WORKERS entry {item!r} must be <node id>=<host>:<port>")
        found[node.strip()] = parse_listen(address.strip())
    return found


def _at_least_one(value: int, name: str) -> int:
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, not {value}")
    return value


def _registries(text: str) -> tuple[str, ...]:
    """GPUHOST_ALLOWED_REGISTRIES: comma-separated host[:port] ([v6]:port), as image references spell them."""
    entries = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    for entry in entries:
        if "/" in entry or " " in entry or entry.count(":") > 1 and not entry.startswith("["):
            raise ConfigError(f"GPUHOST_ALLOWED_REGISTRIES entry {entry!r} must be host[:port], e.g. 127.0.0.1:5000")
    return entries

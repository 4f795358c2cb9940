"""Where the agent's settings come from, in rising priority: defaults, the
config file (/etc/gpuhost-agent/agent.conf), environment variables, flags.

The config file uses the same KEY=VALUE names as the environment, so systemd's
EnvironmentFile= and a hand-edited file say the same thing. The API key is best
kept in its own root-only file named by GPUHOST_API_KEY_FILE.

What each setting is (its variable, default, unit, parser) is declared once in
service/settings_table.py; this module only reads the sources, keeps where
each value came from (`Chosen`, for doctor's view), and checks what spans
several settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpuhost_agent.runtime.egress_rules import Opening, engine_openings
from gpuhost_agent.service import settings_table
from gpuhost_agent.service.settings import (
    DEFAULT_LOCAL_LISTEN,
    SWARM_PORT,
    ConfigError,
    Setting,
    SwarmRole,
    parse_listen,
)
from gpuhost_agent.service.settings_table import BY_FIELD, BY_NAME, SETTINGS

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "DEFAULT_LOCAL_LISTEN",
    "ROOT_STATE_DIR",
    "SWARM_PORT",
    "SWARM_TLS_DIR",
    "AgentConfig",
    "Chosen",
    "ConfigError",
    "SwarmRole",
    "build",
    "choose",
    "default_of",
    "default_state_dir",
    "load",
    "parse_listen",
    "read_config_file",
]

DEFAULT_CONFIG_FILE = Path(settings_table.DEFAULT_CONFIG_FILE)
SWARM_TLS_DIR = Path(settings_table.SWARM_TLS_DIR)
ROOT_STATE_DIR = Path(settings_table.ROOT_STATE_DIR)
FLAG, ENVIRONMENT, FILE, DEFAULT, UNSET = "flag", "environment", "file", "default", "unset"


def default_of(name: str) -> Any:
    """An AgentConfig field's default: its setting's, parsed as a host's text would be."""
    setting = BY_FIELD[name]
    return setting.value_of(setting.default)


@dataclass
class AgentConfig:
    """The settings in effect, typed; one field per setting (service/settings_table.py says what each is)."""

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
    nvml_library: str | None = default_of("nvml_library")
    driver_root: Path = default_of("driver_root")
    location: str | None = default_of("location")
    gpu_check_image: str | None = default_of("gpu_check_image")
    toolkit_config: Path | None = default_of("toolkit_config")
    speed_max_bytes: int = default_of("speed_max_bytes")
    speed_max_seconds: float = default_of("speed_max_seconds")
    publish_address: str | None = default_of("publish_address")
    pids_limit: int = default_of("pids_limit")
    log_max_size: str = default_of("log_max_size")
    log_max_files: int = default_of("log_max_files")
    disk_floor_bytes: int = default_of("disk_floor_bytes")
    rental_disk_bytes: int | None = default_of("rental_disk_bytes")
    disk_watch_seconds: float = default_of("disk_watch_seconds")
    stacks_per_rental: int = default_of("stacks_per_rental")
    deploy_concurrency: int = default_of("deploy_concurrency")
    usage_seconds: float = default_of("usage_seconds")
    reconcile_grace_seconds: float = default_of("reconcile_grace_seconds")
    shutdown_grace_seconds: float = default_of("shutdown_grace_seconds")
    upgrade_health_seconds: float = default_of("upgrade_health_seconds")
    local_release_wheel: Path | None = default_of("local_release_wheel")
    upgrades: str = default_of("upgrades")
    release_key_file: Path = default_of("release_key_file")
    upgrade_allow_version: str | None = default_of("upgrade_allow_version")
    pull_stall_seconds: float = default_of("pull_stall_seconds")
    pull_max_seconds: float = default_of("pull_max_seconds")
    status_socket: Path | None = default_of("status_socket")
    metrics: bool = default_of("metrics")
    metrics_listen: tuple[str, int] | None = default_of("metrics_listen")
    swarm: SwarmRole = default_of("swarm")
    swarm_key: str | None = default_of("swarm_key")
    swarm_listen: tuple[str, int] = default_of("swarm_listen")
    swarm_workers: dict[str, tuple[str, int]] = field(default_factory=lambda: default_of("swarm_workers"))
    swarm_tls_dir: Path = default_of("swarm_tls_dir")
    swarm_encrypted: bool = default_of("swarm_encrypted")
    allowed_registries: tuple[str, ...] = default_of("allowed_registries")
    egress_allow: tuple[str, ...] = default_of("egress_allow")
    pull_guard: tuple[str, int] | None = default_of("pull_guard")
    pull_guard_upstream: tuple[str, int] | None = default_of("pull_guard_upstream")
    fence_allow: tuple[str, ...] = default_of("fence_allow")

    def __post_init__(self) -> None:
        self.swarm = SwarmRole(self.swarm)  # the mode is typed however the config was made

    @property
    def engine_openings(self) -> tuple[Opening, ...]:
        """What the engine fence lets dockerd and the agent reach on the host (runtime/egress_rules.py)."""
        marketplace = urlsplit(self.marketplace_url or "")
        try:
            port = marketplace.port or (443 if marketplace.scheme == "https" else 80)
        except ValueError:
            port = 0
        where = (marketplace.hostname, port) if marketplace.hostname and port else None
        return engine_openings(
            self.pull_guard, self.allowed_registries, self.pull_guard_upstream, where, self.fence_allow
        )

    @property
    def socket_path(self) -> Path:
        """The status socket: as configured, else in the state directory."""
        return self.status_socket or self.state_dir / "agent.sock"

    @property
    def uses_local_marketplace(self) -> bool:
        return not self.marketplace_url


@dataclass(frozen=True)
class Chosen:
    """A setting's text as read, and where from: flag, environment, file, default or unset."""

    text: str | None
    source: str


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


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return ROOT_STATE_DIR
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "gpuhost-agent"


def _read_key(path: object, what: str) -> str | None:
    """A key kept in its own root-only file (install.sh writes them so)."""
    if not path:
        return None
    try:
        return Path(str(path)).read_text().strip() or None
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} key file {path}: {exc.strerror}") from None


def choose(flags: dict[str, object], environ: dict[str, str] | None = None) -> dict[str, Chosen]:
    """Each setting's text from the first source that has one (a flag, the
    environment, the config file, its default); flags holds only what was
    given on the command line. An empty value counts as none."""
    environ = dict(os.environ if environ is None else environ)
    file_values: dict[str, str] = {}
    config = _pick(BY_NAME["config"], flags, environ, file_values)
    config_path = Path(str(config.text))
    if config_path.exists():
        file_values = read_config_file(config_path)
    elif config.source != DEFAULT:
        raise ConfigError(f"config file {config_path} does not exist")
    return {setting.name: _pick(setting, flags, environ, file_values) for setting in SETTINGS}


def _pick(setting: Setting, flags: dict[str, object], environ: dict[str, str], file_values: dict[str, str]) -> Chosen:
    flag = flags.get(setting.name)
    if flag not in (None, ""):
        return Chosen(str(flag), FLAG)
    if environ.get(setting.env):
        return Chosen(environ[setting.env], ENVIRONMENT)
    if setting.in_file and file_values.get(setting.env):
        return Chosen(file_values[setting.env], FILE)
    if setting.name == "state_dir":  # computed at start: it depends on who runs the agent
        return Chosen(str(default_state_dir()), DEFAULT)
    return Chosen(setting.default, DEFAULT if setting.default is not None else UNSET)


def build(chosen: dict[str, Chosen]) -> AgentConfig:
    """The typed configuration from the chosen texts, with the checks that span settings."""
    api_key = chosen["api_key"].text or _read_key(chosen["api_key_file"].text, "API")
    url = BY_NAME["marketplace_url"].value_of(chosen["marketplace_url"].text)
    env_id = chosen["env_id"].text
    if url:
        missing = [
            name
            for name, value in (("GPUHOST_ENV_ID / --env-id", env_id), ("GPUHOST_API_KEY / --api-key", api_key))
            if not value
        ]
        if missing:
            raise ConfigError(f"with a marketplace URL the agent also needs {' and '.join(missing)}")
    values = {
        str(setting.field): setting.value_of(chosen[setting.name].text)
        for setting in SETTINGS
        if setting.field and setting.name not in ("api_key", "marketplace_url", "swarm_key")
    }
    swarm_key = chosen["swarm_key"].text or _read_key(chosen["swarm_key_file"].text, "environment's")
    if values["swarm"] is SwarmRole.WORKER and not swarm_key:
        raise ConfigError(
            "GPUHOST_SWARM=worker needs GPUHOST_SWARM_KEY or GPUHOST_SWARM_KEY_FILE, "
            "the environment's key (the leader's too)"
        )
    if swarm_key and len(swarm_key) < 16:
        raise ConfigError("GPUHOST_SWARM_KEY must have at least 16 characters (e.g. `openssl rand -hex 24`)")
    values["status_socket"] = values["status_socket"] or (values["state_dir"] / "agent.sock").absolute()
    return AgentConfig(marketplace_url=url, api_key=api_key, swarm_key=swarm_key, **values)


def load(flags: dict[str, object], environ: dict[str, str] | None = None) -> AgentConfig:
    """Merge the sources; flags holds only what was given on the command line."""
    return build(choose(flags, environ))

"""Every setting of the agent, declared once (service/settings.py says what a
declaration holds and what is made from this table).

The order is the one --help, docs/operations.md and doctor show, by group.
The checks that span settings (a marketplace URL needs the environment's id
and key; a worker needs the environment's key) are in service/config.py.
"""

from __future__ import annotations

from gpuhost_agent.service import settings as kind
from gpuhost_agent.service.settings import (
    DEFAULT_LOCAL_LISTEN,
    DEFAULT_PULL_GUARD,
    DEPLOYING,
    MARKETPLACE,
    SWARM,
    SWARM_PORT,
    Mode,
    Setting,
)

DEFAULT_CONFIG_FILE = "/etc/gpuhost-agent/agent.conf"
ROOT_STATE_DIR = "/var/lib/gpuhost-agent"  # the state directory of an agent run as root (the system service's)
DEFAULT_RELEASE_KEY_FILE = "/etc/gpuhost-agent/release-key.pub"  # install.sh --release-key writes it
SWARM_TLS_DIR = "/etc/gpuhost-agent/swarm-tls"  # the machine's certificate for the Swarm (service/swarm_tls.py)
SIZES = "size (k, m, g, t)"

# One declaration a line group, kept as written: the formatter would give every argument its own line.
# fmt: off
SETTINGS: tuple[Setting, ...] = (
    # The agent itself.
    Setting("config", "GPUHOST_CONFIG", kind.path, "KEY=VALUE config file, with these variables' names as keys",
            default=DEFAULT_CONFIG_FILE, unit="path", fills=None, in_file=False),
    Setting("state_dir", "GPUHOST_STATE_DIR", kind.absolute_path,
            "where the agent keeps its files (state database, host key, lock)", unit="path",
            shown_default=f"{ROOT_STATE_DIR} as root, else $XDG_STATE_HOME/gpuhost-agent"),
    Setting("log_level", "GPUHOST_LOG_LEVEL", kind.text, "debug, info, warning or error; SIGHUP applies a new one",
            default="info"),
    Setting("compose_command", "GPUHOST_COMPOSE_COMMAND", kind.text, "Compose v2 command, e.g. 'docker compose'",
            unit="command", shown_default="the Compose plugin's binary run directly, else `docker compose`, "
            "else the bundled binary, else a docker-compose v2 on PATH"),
    # The marketplace.
    Setting("marketplace_url", "GPUHOST_MARKETPLACE_URL", kind.marketplace_url,
            "marketplace base URL ending in /v1, https:// unless the marketplace is this machine "
            "(unset: the agent serves the local marketplace)",
            unit="URL", modes=MARKETPLACE, group="marketplace"),
    Setting("env_id", "GPUHOST_ENV_ID", kind.text, "this machine's environment id",
            modes=MARKETPLACE, group="marketplace"),
    Setting("api_key", "GPUHOST_API_KEY", kind.text, "the environment's API key (prefer the key file)",
            modes=MARKETPLACE, group="marketplace", secret=True),
    Setting("api_key_file", "GPUHOST_API_KEY_FILE", kind.text, "root-only file holding the environment's API key",
            unit="path", modes=MARKETPLACE, group="marketplace", fills=None),
    Setting("local_listen", "GPUHOST_LOCAL_LISTEN", kind.parse_listen, "where the local marketplace listens",
            default=DEFAULT_LOCAL_LISTEN, unit="HOST:PORT", modes=(Mode.LOCAL,), group="marketplace"),
    Setting("local_api_key", "GPUHOST_LOCAL_API_KEY", kind.text, "the local marketplace's renter API key",
            modes=(Mode.LOCAL,), group="marketplace", secret=True, shown_default="made at the first start"),
    Setting("speed_max_bytes", "GPUHOST_SPEEDTEST_MAX_BYTES", kind.integer,
            "network speed test: most bytes per direction", default="25000000", unit="bytes",
            modes=DEPLOYING, group="marketplace"),
    Setting("speed_max_seconds", "GPUHOST_SPEEDTEST_MAX_SECONDS", kind.seconds,
            "network speed test: longest time per direction", default="10", unit="s",
            modes=DEPLOYING, group="marketplace"),
    Setting("upgrade_health_seconds", "GPUHOST_UPGRADE_HEALTH_SECONDS", kind.at_least_one_second,
            "how long a version the marketplace offered has, after its restart, to open a session, find the "
            "engine ready and reconcile; otherwise the version before comes back (docs/operations.md, Upgrades)",
            default="300", unit="s", modes=DEPLOYING, group="marketplace"),
    Setting("upgrades", "GPUHOST_UPGRADES", kind.upgrades_mode,
            "offered: a release the marketplace offers is installed when it is signed with the pinned key and "
            "newer; off: never (install.sh --no-upgrades)", default="offered", unit="off/offered",
            modes=DEPLOYING, group="marketplace"),
    Setting("release_key_file", "GPUHOST_RELEASE_KEY_FILE", kind.path,
            "the public key an offered release must be signed with (install.sh --release-key writes it)",
            default=DEFAULT_RELEASE_KEY_FILE, unit="path", modes=DEPLOYING, group="marketplace",
            shown_default=f"{DEFAULT_RELEASE_KEY_FILE}; with the local marketplace, the key it signs with"),
    Setting("upgrade_allow_version", "GPUHOST_UPGRADE_ALLOW_VERSION", kind.text,
            "one version older than the running one that an offer may still install (versions only go forward)",
            unit="version", modes=DEPLOYING, group="marketplace"),
    Setting("local_release_wheel", "GPUHOST_LOCAL_RELEASE_WHEEL", kind.path,
            "a wheel of the agent the local marketplace offers its agents as their release (agentRelease)",
            unit="path", modes=(Mode.LOCAL,), group="marketplace"),
    Setting("reconcile_grace_seconds", "GPUHOST_RECONCILE_GRACE_SECONDS", kind.seconds,
            "how long a stack the marketplace does not list may stay", default="120", unit="s",
            modes=DEPLOYING, group="marketplace"),
    # The machine, as probed and reported.
    Setting("location", "GPUHOST_LOCATION", kind.text,
            "location shown on the listing, e.g. DE-Frankfurt (the agent cannot measure it without asking "
            "a third party)", group="machine"),
    Setting("nvml_library", "GPUHOST_NVML_LIBRARY", kind.text,
            "full path of libnvidia-ml.so.1, when it is not on the loader's path", unit="path", group="machine"),
    Setting("driver_root", "GPUHOST_DRIVER_ROOT", kind.absolute_path,
            "where the NVIDIA driver's device nodes, libraries and tools are for the agent's CDI spec (as "
            "nvidia-ctk's --driver-root: a driver installed under a folder of its own)", default="/",
            unit="path", group="machine"),
    Setting("gpu_check_image", "GPUHOST_GPU_CHECK_IMAGE", kind.text,
            "a local image started with --gpus all and `true` as the live GPU container check (never pulled)",
            unit="image", group="machine"),
    Setting("toolkit_config", "GPUHOST_TOOLKIT_CONFIG", kind.path, "the NVIDIA Container Toolkit's config.toml",
            unit="path", group="machine", shown_default="/etc/nvidia-container-runtime/config.toml"),
    # Deploys and the sandbox.
    Setting("settle_seconds", "GPUHOST_SETTLE_SECONDS", kind.seconds,
            "after a deploy, how long its containers must stay up before it is APPLIED", default="3", unit="s",
            modes=DEPLOYING, group="deploys"),
    Setting("stop_timeout", "GPUHOST_STOP_TIMEOUT", kind.integer,
            "how long a container may take to stop before it is killed", default="10", unit="s",
            modes=DEPLOYING, group="deploys"),
    Setting("deploy_concurrency", "GPUHOST_DEPLOY_CONCURRENCY", kind.at_least_one,
            "deploys run at once, one fewer for any one rental; the others wait, APPLYING, with a reason saying so "
            "(removals never wait; "
            "docs/performance.md)",
            default="8", unit="deploys", modes=DEPLOYING, group="deploys"),
    Setting("stacks_per_rental", "GPUHOST_STACKS_PER_RENTAL", kind.at_least_one,
            "stacks one rental may have on this host (each makes networks: see Docker's address pools)",
            default="16", unit="stacks", modes=DEPLOYING, group="deploys"),
    Setting("publish_address", "GPUHOST_PUBLISH_ADDRESS", kind.text, "host address renters' ports are published on",
            unit="address", modes=DEPLOYING, group="deploys",
            shown_default="0.0.0.0; 127.0.0.1 with the local marketplace"),
    Setting("allowed_registries", "GPUHOST_ALLOWED_REGISTRIES", kind.registries,
            "registries on the host's own addresses renters may pull from, comma-separated (IPv6 in brackets; "
            "see Registries on the host itself; make run and the tests allow 127.0.0.1:5000)", default="",
            unit="host[:port],...", modes=DEPLOYING, group="deploys"),
    Setting("egress_allow", "GPUHOST_EGRESS_ALLOW", kind.egress_networks,
            "addresses or networks beyond the internet a rental's containers may reach, comma-separated (a registry "
            "mirror, a proxy); the host itself never (see Where a rental's containers connect)", default="",
            unit="address[/prefix],...", modes=DEPLOYING, group="deploys"),
    Setting("pull_guard", "GPUHOST_PULL_GUARD", kind.pull_guard,
            "the loopback address of the proxy dockerd's pulls go through, which dials only addresses that are "
            "not the host's (install.sh points Docker at it; see Registries and the pull guard); off: none",
            default=DEFAULT_PULL_GUARD, unit="HOST:PORT or off", modes=DEPLOYING, group="deploys"),
    Setting("pull_guard_upstream", "GPUHOST_PULL_GUARD_UPSTREAM", kind.proxy_url,
            "the host's own HTTP proxy, which the pull guard asks for each judged address (install.sh moves "
            "Docker's proxy here)", unit="http://HOST:PORT", modes=DEPLOYING, group="deploys"),
    Setting("fence_allow", "GPUHOST_FENCE_ALLOW", kind.registries,
            "what dockerd and the agent may also reach on this host itself, comma-separated host:port (a log "
            "collector such as fluentd's 127.0.0.1:24224, a loopback registry mirror); the engine fence refuses "
            "the rest (see The pull guard)", default="", unit="host:port,...", modes=DEPLOYING, group="deploys"),
    Setting("pids_limit", "GPUHOST_PIDS_LIMIT", kind.integer,
            "processes per container, and per rental (dockerd's cgroupfs or systemd driver)", default="4096",
            unit="processes", modes=DEPLOYING, group="deploys"),
    Setting("log_max_size", "GPUHOST_LOG_MAX_SIZE", kind.log_size,
            "each container's log file, before Docker rotates it", default="50m", unit="size (k, m, g)",
            modes=DEPLOYING, group="deploys"),
    Setting("log_max_files", "GPUHOST_LOG_MAX_FILES", kind.at_least_one,
            "rotated log files kept per container (the cap is size x files)", default="3", unit="files",
            modes=DEPLOYING, group="deploys"),
    Setting("usage_seconds", "GPUHOST_USAGE_SECONDS", kind.at_least_one_second,
            "how often GPU usage is counted (also at every assignment and release; at least 1)",
            default="60", unit="s", modes=DEPLOYING, group="deploys"),
    Setting("shutdown_grace_seconds", "GPUHOST_SHUTDOWN_GRACE_SECONDS", kind.seconds,
            "on SIGTERM, how long running jobs may finish before they are abandoned", default="20", unit="s",
            modes=DEPLOYING, group="deploys"),
    Setting("pull_stall_seconds", "GPUHOST_PULL_STALL_SECONDS", kind.at_least_one_second,
            "a renter's image pull that moves no byte for this long fails the deploy, naming the image and its "
            "registry (at least 1)", default="120", unit="s", modes=DEPLOYING, group="deploys"),
    Setting("pull_max_seconds", "GPUHOST_PULL_MAX_SECONDS", kind.at_least_one_second,
            "the longest a renter's image pull may take when its size is unknown (a known size gets 120 s plus "
            "1 s per MB, never more than this); past it the pull is stopped and the deploy fails, naming the image "
            "and its registry", default="10800", unit="s", modes=DEPLOYING, group="deploys"),
    # The disk.
    Setting("disk_floor", "GPUHOST_DISK_FLOOR", kind.size_bytes,
            "free space on Docker's disk below which no stack is deployed (0: no floor); images the agent "
            "pulled for renters and no container uses are evicted, least recently used, to keep it", default="20g",
            unit=SIZES, modes=DEPLOYING, group="disk", fills="disk_floor_bytes"),
    Setting("rental_disk", "GPUHOST_RENTAL_DISK", kind.size_bytes, "one rental's share of Docker's disk",
            unit=SIZES, modes=DEPLOYING, group="disk", fills="rental_disk_bytes",
            shown_default="its part of the usable disk, by GPUs"),
    Setting("disk_watch_seconds", "GPUHOST_DISK_WATCH_SECONDS", kind.at_least_one_second,
            "how often each rental's disk use is measured (at least 1)", default="60", unit="s",
            modes=DEPLOYING, group="disk"),
    # The status socket and metrics.
    Setting("status_socket", "GPUHOST_STATUS_SOCKET", kind.absolute_path, "Unix socket for `gpuhost-agent status`",
            unit="path", modes=DEPLOYING, group="status", shown_default="<state dir>/agent.sock"),
    Setting("metrics", "GPUHOST_METRICS", kind.on_off, "/metrics (Prometheus) on the status socket",
            default="off", unit="on/off", modes=DEPLOYING, group="status"),
    Setting("metrics_listen", "GPUHOST_METRICS_LISTEN", kind.parse_listen,
            "/metrics also on this loopback TCP address, e.g. 127.0.0.1:9464", unit="HOST:PORT",
            modes=DEPLOYING, group="status"),
    # An environment of several machines (docs/swarm.md).
    Setting("swarm", "GPUHOST_SWARM", kind.swarm_role,
            "leader: this agent deploys to the Swarm its engine manages; worker: it serves such a leader "
            "on another machine; off: one machine", default="off", unit="leader/worker/off", modes=SWARM,
            group="swarm"),
    Setting("swarm_key", "GPUHOST_SWARM_KEY", kind.text,
            "the environment's key between the leader and the workers, the same on all, at least 16 characters "
            "(prefer the key file); a worker needs it, a leader without it reaches no agent on other machines",
            modes=SWARM, group="swarm", secret=True),
    Setting("swarm_key_file", "GPUHOST_SWARM_KEY_FILE", kind.text,
            "root-only file holding the environment's key (install.sh --swarm-key-file)", unit="path",
            modes=SWARM, group="swarm", fills=None),
    Setting("swarm_listen", "GPUHOST_SWARM_LISTEN", kind.swarm_listen,
            "where a worker serves the leader: one address of this machine, never every address "
            "(:PORT: the engine's Swarm address)", default=f":{SWARM_PORT}", unit="ADDRESS:PORT",
            modes=(Mode.WORKER,), group="swarm"),
    Setting("swarm_workers", "GPUHOST_SWARM_WORKERS", kind.swarm_workers,
            "where the leader finds a worker that is not at its node's Swarm address", default="",
            unit="<node id>=<host>:<port>,...", modes=(Mode.LEADER,), group="swarm"),
    Setting("swarm_tls_dir", "GPUHOST_SWARM_TLS_DIR", kind.absolute_path,
            "the environment's CA and this machine's certificate for the mutual TLS between the leader and "
            "the workers (install.sh --swarm leader makes them; --swarm-worker-bundle FILE on the leader, then "
            "--swarm worker --swarm-tls-file FILE on a worker)", default=SWARM_TLS_DIR, unit="path", modes=SWARM,
            group="swarm"),
    Setting("swarm_encrypted", "GPUHOST_SWARM_ENCRYPTED", kind.on_off,
            "the stacks' overlay networks encrypted between machines (IPsec; the kernel needs ESP)",
            default="off", unit="on/off", modes=(Mode.LEADER,), group="swarm"),
)
# fmt: on

BY_NAME = {setting.name: setting for setting in SETTINGS}
BY_FIELD = {setting.field: setting for setting in SETTINGS if setting.field}

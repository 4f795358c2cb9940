"""Command line: `gpuhost-agent run` (the daemon), `probe` and `doctor` (the machine,
for its host), and `version`."""

from __future__ import annotations

import argparse
import sys

from gpuhost_agent import __version__
from gpuhost_agent.common import logs
from gpuhost_agent.runtime.compose import ComposeNotFound
from gpuhost_agent.service import config as config_module
from gpuhost_agent.service import daemon, host_check, status_cli


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuhost-agent", description="Host agent of the GPU rental marketplace.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the agent (with the local marketplace when no URL is configured)")
    run.add_argument("--config", help=f"KEY=VALUE config file (default {config_module.DEFAULT_CONFIG_FILE})")
    run.add_argument("--marketplace-url", help="marketplace base URL ending in /v1 (GPUHOST_MARKETPLACE_URL)")
    run.add_argument("--env-id", help="this machine's environment id (GPUHOST_ENV_ID)")
    run.add_argument("--api-key", help="the environment's API key (GPUHOST_API_KEY; prefer --api-key-file)")
    run.add_argument("--api-key-file", help="file holding the environment's API key (GPUHOST_API_KEY_FILE)")
    run.add_argument("--state-dir", help="where the agent keeps its files (GPUHOST_STATE_DIR)")
    run.add_argument("--local-listen", help="HOST:PORT of the local marketplace (default 127.0.0.1:8787)")
    run.add_argument("--local-api-key", help="renter API key of the local marketplace (GPUHOST_LOCAL_API_KEY)")
    run.add_argument("--log-level", help="debug, info, warning or error (GPUHOST_LOG_LEVEL)")
    run.add_argument("--compose-command", help="Compose v2 command, e.g. 'docker compose' (GPUHOST_COMPOSE_COMMAND)")
    probe = commands.add_parser("probe", help="print the systemData the agent would send (GPUs, host, listing fields)")
    probe.add_argument("--json", action="store_true", help="machine-readable JSON instead of a table")
    doctor = commands.add_parser("doctor", help="run the compliance checks; exit status 1 when not compliant")
    doctor.add_argument("--json", action="store_true", help="machine-readable JSON instead of text")
    for sub in (probe, doctor):
        sub.add_argument("--config", help=f"KEY=VALUE config file (default {config_module.DEFAULT_CONFIG_FILE})")
        sub.add_argument("--compose-command", help="Compose v2 command, e.g. 'docker compose'")
    status = commands.add_parser(
        "status", help="is the agent running and connected: heartbeat, last error, compliance, stacks and tunnels"
    )
    status.add_argument("--json", action="store_true", help="machine-readable JSON instead of text")
    status.add_argument(
        "--socket", dest="status_socket", help="the running agent's status socket (GPUHOST_STATUS_SOCKET)"
    )
    status.add_argument("--config", help=f"KEY=VALUE config file (default {config_module.DEFAULT_CONFIG_FILE})")
    status.add_argument("--state-dir", help="the agent's state directory (GPUHOST_STATE_DIR)")
    commands.add_parser("version", help="print the agent's version")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "version":
        print(__version__)
        return 0
    flags = {key: value for key, value in vars(args).items() if key not in ("command", "json")}
    if args.command == "status":
        try:  # a dummy api_key: status never needs the key, and a non-root user cannot read its file
            config = config_module.load({**flags, "api_key": "unused-by-status"})
        except (config_module.ConfigError, ValueError) as exc:
            print(f"gpuhost-agent: configuration error: {exc}", file=sys.stderr)
            return 2
        return status_cli.run(config.socket_path, args.json)
    try:
        config = config_module.load(flags)
        logs.configure(config.log_level if args.command == "run" else "warning")
    except (config_module.ConfigError, ValueError) as exc:
        print(f"gpuhost-agent: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.command in ("probe", "doctor"):
        return getattr(host_check, args.command)(config, args.json)
    try:
        return daemon.run(config, reload=lambda: config_module.load(flags))
    except ComposeNotFound as exc:
        print(f"gpuhost-agent: {exc}", file=sys.stderr)
        return 3
    except OSError as exc:
        print(f"gpuhost-agent: cannot start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

"""Command line: `gpuhost-agent run` (the daemon), `probe` and `doctor` (the machine,
for its host), `status`, `support-bundle` (an archive for a ticket) and `version`.

The settings' flags are made from their declarations (service/settings_table.py):
`run`, `probe`, `doctor` and `support-bundle` have one for every setting, `status`
the few it reads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuhost_agent import __version__
from gpuhost_agent.runtime.egress_rules import Opening
from gpuhost_agent.service import config as config_module
from gpuhost_agent.service.settings_doc import GROUPS, flag_help
from gpuhost_agent.service.settings_table import SETTINGS
from gpuhost_agent.service.status import cli as status_cli

SOCKET_SETTINGS = ("state_dir", "status_socket")  # status's: where the agent's socket is


def _add_settings(parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None, **options: str) -> None:
    """A flag for each setting named (every one when None), its help made from
    the setting's declaration; `options` renames a flag (status's --socket)."""
    chosen = [setting for setting in SETTINGS if names is None or setting.name in names]
    for group, title in GROUPS.items():
        members = [setting for setting in chosen if setting.group == group]
        if not members:
            continue
        flags = parser.add_argument_group(f"settings: {title}") if names is None else parser
        for setting in members:
            flags.add_argument(
                options.get(setting.name, setting.option),
                dest=setting.name,
                metavar=_metavar(setting.unit),
                help=flag_help(setting),
            )


def _metavar(unit: str) -> str:
    """The flag's placeholder, from the setting's unit: SECONDS, PATH, SIZE, HOST:PORT, ..."""
    if unit == "s":
        return "SECONDS"
    if unit.startswith("size"):
        return "SIZE"
    return unit.upper() if unit and " " not in unit and "," not in unit else "VALUE"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuhost-agent", description="Host agent of the GPU rental marketplace.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="run the agent (with the local marketplace when no URL is configured)",
        description="Run the agent. Each setting comes from its flag, else its environment variable, else the "
        "config file (the same KEY=VALUE names), else its default (docs/operations.md, Settings).",
    )
    _add_settings(run)
    probe = commands.add_parser("probe", help="print the systemData the agent would send (GPUs, host, listing fields)")
    probe.add_argument("--json", action="store_true", help="machine-readable JSON instead of a table")
    doctor = commands.add_parser(
        "doctor",
        help="run the compliance checks and show the settings in effect; exit status 1 when not compliant",
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable JSON instead of text")
    bundle = commands.add_parser(
        "support-bundle",
        help="write one archive to attach to a support ticket: versions, doctor, probe, status, the agent's log, "
        "the engine's info, the unit; secrets scrubbed, renters' data left out",
        description="Write a .tar.gz (mode 0600) for a support ticket; its manifest.json says what each file is "
        "and what could not be gathered. Every secret the configuration names is scrubbed (docs/operations.md, "
        "A support bundle).",
    )
    bundle.add_argument("--since", default="24h", help="how far back the agent's log goes: 90m, 24h, 7d (default 24h)")
    bundle.add_argument(
        "--output", metavar="PATH", help="where to write it (default ./gpuhost-support-<host>-<UTC time>.tar.gz)"
    )
    for sub in (probe, doctor, bundle):
        _add_settings(sub)  # the same as run's: doctor shows the settings run would have
    status = commands.add_parser(
        "status", help="is the agent running and connected: heartbeat, last error, compliance, stacks and tunnels"
    )
    status.add_argument("--json", action="store_true", help="machine-readable JSON instead of text")
    _add_settings(status, ("config", *SOCKET_SETTINGS), status_socket="--socket")
    commands.add_parser("version", help="print the agent's version")
    egress = commands.add_parser(
        "egress",
        help="the firewall rules that keep a rental's containers off the host and its networks",
        description="The agent writes these rules at start and keeps them (docs/operations.md, Where a rental's "
        "containers connect); they stay when it stops. `remove` takes them away (install.sh --uninstall runs it).",
    )
    egress.add_argument(
        "action",
        choices=["apply", "remove"],
        help="apply: write them now, before the engine starts too (the Docker unit's ExecStartPre "
        "install.sh writes runs it at boot); remove: take them away",
    )
    _add_settings(egress, ("config", "egress_allow"))
    cdi = commands.add_parser(
        "cdi",
        help="the agent's CDI spec of the host's GPUs, made true before dockerd starts",
        description="The running agent writes /etc/cdi/gpuhost-nvidia.yaml and keeps it (docs/hosts.md). `refresh` "
        "rewrites it for the GPUs NVML sees now, or removes it where it cannot: Docker's unit runs it before dockerd "
        "starts renters' containers again at boot (install.sh's drop-in).",
    )
    cdi.add_argument("action", choices=["refresh"], help="refresh: rewrite or remove the agent's spec now")
    _add_settings(cdi, ("config", "nvml_library", "driver_root"))
    return parser


def _configuration_error(exc: Exception) -> int:
    print(f"gpuhost-agent: configuration error: {exc}", file=sys.stderr)
    return 2


def _running_agents_settings(config: config_module.AgentConfig) -> tuple[list | None, str]:
    """The settings of the agent running on doctor's state directory, read over
    its status socket, and whose they are; (None, ...) when none answers: then
    doctor shows the settings it would run with itself, and says so."""
    try:
        answer = status_cli.fetch_json(config.socket_path, "/settings", timeout=5.0)
    except status_cli.StatusUnavailable:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("settings"), list) or not answer["settings"]:
        return None, f"settings doctor reads itself (no agent answers on {config.socket_path})"
    return answer["settings"], f"settings of the running agent (pid {answer.get('pid')}, on {config.socket_path})"


def _settings_shown(config: config_module.AgentConfig, chosen: dict) -> tuple[list, str]:
    """The running agent's settings (_running_agents_settings), else the ones
    this command would run with itself; and whose they are."""
    from gpuhost_agent.service import settings_view

    settings, whose = _running_agents_settings(config)
    return (settings_view.effective(chosen, config) if settings is None else settings), whose


def _refresh_cdi_spec(nvml_library: str | None, driver_root: Path) -> int:
    """The agent's CDI spec made true for the GPUs now, or removed (inventory/driver_cdi.refresh)."""
    from gpuhost_agent.inventory import driver_cdi, gpu_delivery
    from gpuhost_agent.inventory.nvml_probe import NvmlProbe

    nvml = NvmlProbe(nvml_library)
    try:
        inventory = nvml.inventory()
    except Exception as exc:  # no GPU facts: the spec goes rather than stay possibly wrong
        print(f"gpuhost-agent: NVML failed: {exc}", file=sys.stderr)
        inventory = {}
    finally:
        nvml.close()
    said = driver_cdi.refresh(inventory, driver_root=driver_root)
    print("\n".join(said) if said else f"no CDI spec of the agent's in {' or '.join(gpu_delivery.DEFAULT_SPEC_DIRS)}")
    return 0


def _remove_egress_rules() -> int:
    from gpuhost_agent.runtime.host_firewall import FirewallError, HostFirewall

    try:
        removed = HostFirewall().remove()
    except FirewallError as exc:
        print(f"gpuhost-agent: egress rules not removed: {exc}", file=sys.stderr)
        return 1
    print(f"removed: {', '.join(removed)}" if removed else "no egress rule of the agent's was in place")
    return 0


def _apply_egress_rules(allowed: tuple[str, ...], openings: tuple[Opening, ...]) -> int:
    from gpuhost_agent.runtime.host_firewall import FirewallError, HostFirewall

    firewall = HostFirewall()
    try:
        found = firewall.ensure(firewall.wanted(allowed, openings), before_engine=True)
    except FirewallError as exc:
        print(f"gpuhost-agent: egress rules not written: {exc}", file=sys.stderr)
        return 1
    print(f"written: {found.said()}" if found else "the egress rules were in place")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "version":
        print(__version__)
        return 0
    flags = {key: value for key, value in vars(args).items() if key not in ("command", "json")}
    if args.command == "egress":
        if args.action == "remove":
            return _remove_egress_rules()
        try:  # the egress settings alone matter: no key needed, none read
            egress = config_module.build(config_module.choose({**flags, "api_key": "unused-by-egress"}))
        except (config_module.ConfigError, ValueError) as exc:
            return _configuration_error(exc)
        return _apply_egress_rules(egress.egress_allow, egress.engine_openings)
    if args.command == "cdi":
        try:  # the GPU settings alone matter: no key needed, none read
            cdi = config_module.build(config_module.choose({**flags, "api_key": "unused-by-cdi"}))
        except (config_module.ConfigError, ValueError) as exc:
            return _configuration_error(exc)
        return _refresh_cdi_spec(cdi.nvml_library, cdi.driver_root)
    if args.command == "status":
        try:  # a dummy api_key: status never needs the key, and a non-root user cannot read its file
            chosen = config_module.choose({**flags, "api_key": "unused-by-status"})
            config = config_module.build(chosen)
        except (config_module.ConfigError, ValueError) as exc:
            return _configuration_error(exc)
        # Where no one named the agent, `make run`'s is looked for too (status_cli.development_sockets).
        named = any(chosen[name].source not in (config_module.DEFAULT, config_module.UNSET) for name in SOCKET_SETTINGS)
        fallbacks = () if named else status_cli.development_sockets()
        return status_cli.run(config.socket_path, args.json, fallbacks=fallbacks)
    try:
        chosen = config_module.choose(flags)
        config = config_module.build(chosen)
    except (config_module.ConfigError, ValueError) as exc:
        return _configuration_error(exc)
    # The agent's modules (aiohttp, the engine's client, the sandbox) are imported
    # here, not at the top: `status`, `version` and a configuration error answer
    # in a fifth of a second, where loading the whole agent took 1.3 s.
    from gpuhost_agent.common import logs
    from gpuhost_agent.service import host_check, settings_view

    try:
        if args.command == "run":
            logs.configure(config.log_level, stderr_only_log=True)
        else:
            logs.configure("warning")
    except ValueError as exc:  # the log level: logs.configure knows the names
        return _configuration_error(exc)
    if args.command == "probe":
        return host_check.probe(config, args.json)
    if args.command == "doctor":
        settings, whose = _settings_shown(config, chosen)
        return host_check.doctor(config, args.json, settings, whose)
    if args.command == "support-bundle":
        from gpuhost_agent.service import support_bundle

        settings, whose = _settings_shown(config, chosen)
        return support_bundle.run(config, chosen, since=args.since, output=args.output, settings=settings, whose=whose)
    from gpuhost_agent.service import launcher

    launcher.launch(config.state_dir, sys.argv[1:] if argv is None else argv)  # the version the upgrade record chooses
    from gpuhost_agent.runtime.compose import ComposeNotFound
    from gpuhost_agent.service import daemon  # the agent itself: probe and doctor do without it

    log = logs.get_logger(__name__)  # the daemon's stderr holds log lines alone
    try:
        return daemon.run(
            config, reload=lambda: config_module.load(flags), settings=settings_view.effective(chosen, config)
        )
    except ComposeNotFound as exc:
        log.error("agent_cannot_start", error=str(exc))
        return 3
    except OSError as exc:
        log.error("agent_cannot_start", error=f"cannot start: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130

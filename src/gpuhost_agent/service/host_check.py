"""`gpuhost-agent probe` and `gpuhost-agent doctor`: the agent's own view of the
machine, for a host at a terminal, with no marketplace needed.

Both run exactly the probe the daemon runs, and `probe --json` prints exactly
the body the daemon sends as systemData (`system_data.as_sent`). The network
speed is null there (it is measured against the marketplace, by the running
agent) and there is no clock-skew check (no marketplace to compare with);
doctor uses the default minimums, which the marketplace may raise when the
agent runs. What they print for a person is made visible first
(common/visible.py): a probe's text may quote what containers or images chose.
doctor then shows the settings in effect and where each came from, the keys
masked (service/settings_view.py).
"""

from __future__ import annotations

import asyncio
import json

from gpuhost_agent.common.visible import visible_tree
from gpuhost_agent.inventory import render
from gpuhost_agent.inventory.system_data import as_sent, build_report
from gpuhost_agent.protocol.requirements import Requirements
from gpuhost_agent.protocol.wire_system import SystemDataReport
from gpuhost_agent.runtime.compose import ComposeNotFound, find_compose_command
from gpuhost_agent.service import settings_view, topology
from gpuhost_agent.service.config import AgentConfig
from gpuhost_agent.service.probe_parts import build_probe


async def machine_report(config: AgentConfig) -> SystemDataReport:
    """One probe and its compliance, as the daemon makes them (probe, doctor, support-bundle)."""
    try:
        compose = await asyncio.to_thread(find_compose_command, config.compose_command)
    except ComposeNotFound:
        compose = None
    probe = build_probe(config, compose)
    try:
        data = await probe.prober.system_data()
    finally:
        await probe.close()
    return build_report(data, Requirements(), None)


def probe(config: AgentConfig, as_json: bool) -> int:
    report = asyncio.run(machine_report(config))
    if as_json:
        print(json.dumps(as_sent(report), indent=2, sort_keys=True))
    else:
        print(render.probe_table(visible_tree(report)))
    return 0


def doctor(config: AgentConfig, as_json: bool, settings: list[dict[str, str]] | None = None, whose: str = "") -> int:
    """Exit status 1 when the host is not compliant, so scripts can gate on it.
    `settings` is the view of the settings in effect (service/settings_view.py),
    the running agent's when one answers (`whose` says): printed after the
    checks, in JSON as `settings` (and `settingsOf`) beside the compliance's keys."""
    report = asyncio.run(machine_report(config))
    compliance = report["compliance"]
    watched = topology.doctor_checks(config)  # doctor's own (a Swarm machine's certificate), not the marketplace's
    compliance = {**compliance, "checks": [*compliance["checks"], *watched]}
    compliance["isCompliant"] = compliance["isCompliant"] and all(check["ok"] for check in watched)
    if as_json:
        shown = {**compliance, "settings": settings, "settingsOf": whose} if settings is not None else compliance
        print(json.dumps(shown, indent=2))
    else:
        print(render.doctor_lines(visible_tree(compliance["checks"])))
        if settings is not None:
            print("\n" + settings_view.lines(settings, whose))
    return 0 if compliance["isCompliant"] else 1

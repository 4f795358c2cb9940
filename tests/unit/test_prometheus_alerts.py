"""The shipped alerting rules (prometheus/gpuhost-agent-alerts.yml),
checked and tested by Debian's promtool (scripts/install-system-deps.sh
installs it): every alert fires and resolves in its promtool test, has its runbook
line in docs/operations.md, and judges only figures the agent exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuhost_agent.service import metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "prometheus" / "gpuhost-agent-alerts.yml"
RULE_TESTS = ROOT / "prometheus" / "gpuhost-agent-alerts.test.yml"


def _promtool(*args: str) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    assert promtool, "no promtool: bash scripts/install-system-deps.sh installs it (Debian's prometheus package)"
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=RULES.parent)


def _alerts() -> dict[str, dict]:
    return {rule["alert"]: rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}


def test_promtool_checks_the_rules_and_runs_their_tests() -> None:
    checked = _promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_alert_is_tested_firing_and_resolving() -> None:
    cases: dict[str, list[bool]] = {}
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in test["alert_rule_test"]:
            cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    for name in _alerts():
        seen = cases.get(name, [])
        assert True in seen and seen[-1] is False and seen[0] is False, f"{name}: quiet, firing, then resolved: {seen}"


def test_every_alert_has_its_runbook_line() -> None:
    section = (ROOT / "docs" / "operations.md").read_text().split("\n## Alerts that page\n", 1)[1].split("\n## ", 1)[0]
    for name, rule in _alerts().items():
        assert f"- **{name}**" in section, f"{name} has no runbook line in docs/operations.md"
        assert rule["annotations"]["runbook"] == f"docs/operations.md, Alerts that page: {name}"


def test_the_alerts_judge_only_figures_the_agent_exports() -> None:
    exported = set()
    for family in text_string_to_metric_families(metrics.render({}).decode()):
        exported |= {family.name, f"{family.name}_total"}
    used = {name for rule in _alerts().values() for name in re.findall(r"\bgpuhost_[a-z_]+", rule["expr"])}
    assert used and used <= exported, used - exported

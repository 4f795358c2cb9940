"""systemd/gpuhost-agent.service: the directives it must hold, the ones
that must never be there (they would hide /dev/nvidia* from NVML), the copy
embedded in install.sh, and `systemd-analyze verify`.

verify checks that ExecStart's binary exists, so it runs on a copy whose
ExecStart points at an executable of the test's own; test_install.py also
verifies the unit as installed, with the real binary, inside the Debian 12
rootfs. systemd-analyze comes with the `systemd` package
(scripts/install-system-deps.sh installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "gpuhost-agent.service"
INSTALL_SH = ROOT / "install.sh"
EXEC_START = "/opt/gpuhost-agent/venv/bin/gpuhost-agent run --config /etc/gpuhost-agent/agent.conf"


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """{section: [(key, value), ...]}, repeated keys kept in order (systemd's own syntax)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"directive outside a section: {line}"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict, section: str, key: str) -> list[str]:
    return [value for k, value in unit.get(section, []) if k == key]


def one(unit: dict, section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"[{section}] {key}= appears {len(found)} times"
    return found[0]


def seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)(s|min)?", text)
    assert match, text
    return int(match.group(1)) * (60 if match.group(2) == "min" else 1)


@pytest.fixture(scope="module")
def unit() -> dict:
    return parse_unit(UNIT.read_text())


def test_notify_type_with_watchdog(unit: dict) -> None:
    assert one(unit, "Service", "Type") == "notify"
    assert one(unit, "Service", "NotifyAccess") == "main"  # compose children may not speak for us
    assert 10 <= seconds(one(unit, "Service", "WatchdogSec")) <= 120
    assert one(unit, "Service", "ExecStart") == EXEC_START


def test_restarts_forever_with_a_back_off(unit: dict) -> None:
    assert one(unit, "Service", "Restart") == "always"
    assert seconds(one(unit, "Service", "RestartSec")) >= 1
    assert one(unit, "Unit", "StartLimitIntervalSec") == "0"
    # RestartSteps= needs systemd >= 254; it lives in install.sh's drop-in, not here.
    assert not values(unit, "Service", "RestartSteps")


def test_starts_after_docker_and_the_network_without_depending_on_them(unit: dict) -> None:
    for key in ("After", "Wants"):
        names = " ".join(values(unit, "Unit", key)).split()
        assert "docker.service" in names and "network-online.target" in names, key
    assert not values(unit, "Unit", "Requires") and not values(unit, "Unit", "BindsTo")
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_stop_leaves_renters_containers_and_kills_only_our_leftovers(unit: dict) -> None:
    # mixed: SIGTERM to the agent alone (it winds its Compose runs down), then the
    # cgroup (ours only: containers live in Docker's) after TimeoutStopSec.
    assert one(unit, "Service", "KillMode") == "mixed"
    assert seconds(one(unit, "Service", "TimeoutStopSec")) >= 30


def test_logs_go_to_the_journal(unit: dict) -> None:
    assert one(unit, "Service", "StandardOutput") == "journal"
    assert one(unit, "Service", "StandardError") == "journal"
    assert one(unit, "Service", "SyslogIdentifier") == "gpuhost-agent"


# The agent's capabilities, each for a job (the unit's comment says which).
KEPT_CAPABILITIES = {
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_SYS_ADMIN",
    "CAP_SYS_PTRACE",
    "CAP_NET_ADMIN",  # the egress rules (runtime/host_firewall.py): without it none is ever written
    "CAP_NET_RAW",  # legacy iptables' socket
}
# What `systemd-analyze security` asks for that the unit does not set: each is
# named in the unit's "Left out on purpose" comment with its reason.
LEFT_OUT = (
    "PrivateDevices",
    "DevicePolicy",
    "DeviceAllow",
    "ProtectClock",
    "PrivateNetwork",
    "IPAddressDeny",
    "MemoryDenyWriteExecute",
    "User",
    "DynamicUser",
    "PrivateUsers",
    "ProtectProc",
    "ProcSubset",
    "RootDirectory",
    "RootImage",
    "RemoveIPC",
)


def test_hardening_that_still_reaches_docker_and_nvml(unit: dict) -> None:
    service = dict(unit["Service"])
    for key, want in (
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateMounts", "yes"),
        ("ReadWritePaths", "/var/lib/gpuhost-agent /sys/fs/cgroup -/run/xtables.lock -/etc/cdi"),
        ("StateDirectory", "gpuhost-agent"),
        ("StateDirectoryMode", "0700"),
        # A Swarm tunnel's socket made in the container's network namespace
        # (runtime/netns_dial.py); the rental cgroups and the file helper's
        # joining the container's cgroups, with the rest of /sys read-only.
        ("RestrictNamespaces", "net"),
        ("ProtectControlGroups", "no"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectHostname", "yes"),
        ("RestrictRealtime", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("LockPersonality", "yes"),
        ("SystemCallArchitectures", "native"),
        ("SystemCallErrorNumber", "EPERM"),
        ("UMask", "0077"),
        # Two sockets per tunnel or SSH connection, up to 2048 of them.
        ("LimitNOFILE", "65536"),
    ):
        assert service.get(key) == want, key
    # These would take /dev/nvidia* away from NVML (ProtectClock implies DeviceAllow=char-rtc,
    # and any DeviceAllow= closes every other device) or the network from the agent.
    for key in (*LEFT_OUT, "InaccessiblePaths"):
        assert key not in service, f"{key}= must not be set (see the unit's comments)"
    families = service["RestrictAddressFamilies"].split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)


def test_root_keeps_only_the_capabilities_the_agent_uses(unit: dict) -> None:
    kept = set(one(unit, "Service", "CapabilityBoundingSet").split())
    assert kept == KEPT_CAPABILITIES
    # What would turn a bug of the agent into the host's kernel, clock, devices or network.
    assert not kept & {"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_TIME", "CAP_MKNOD", "CAP_BPF"}
    assert not values(unit, "Service", "AmbientCapabilities")


def test_system_calls_no_part_of_the_agent_makes_are_refused(unit: dict) -> None:
    denied = one(unit, "Service", "SystemCallFilter")
    assert denied.startswith("~"), "a deny-list: an allow-list would have to follow Compose's Go runtime"
    groups = set(denied[1:].split())
    assert {"@clock", "@debug", "@module", "@mount", "@raw-io", "@reboot", "@swap"} <= groups
    # setns/setuid (@privileged) and Go's setrlimit (@resources) are the agent's own.
    assert not groups & {"@privileged", "@resources", "@system-service", "@process", "@network-io"}


def test_every_hardening_left_out_says_why() -> None:
    comments = "\n".join(line for line in UNIT.read_text().splitlines() if line.startswith("#"))
    left_out = comments.split("# Left out on purpose:", 1)[1]
    for key in LEFT_OUT:
        assert f"{key}=" in left_out, f"{key}= is neither set nor explained in the unit"
    assert "ProtectControlGroups=" not in left_out and "# no: " in comments  # set to no, said beside it


def test_install_sh_embeds_exactly_this_unit() -> None:
    printed = subprocess.run(["bash", str(INSTALL_SH), "--print-unit"], capture_output=True, text=True, check=True)
    assert printed.stdout == UNIT.read_text(), (
        "install.sh's unit_text() and systemd/gpuhost-agent.service differ: change both together"
    )


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if not found:
        pytest.skip(
            "systemd-analyze is not installed (the systemd package; scripts/install-system-deps.sh installs it)"
        )
    return found


def _verify(analyze: str, unit_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [analyze, "verify", str(unit_dir / "gpuhost-agent.service")], capture_output=True, text=True, timeout=60
    )


def _copy_with_runnable_exec_start(tmp_path: Path, text: str) -> Path:
    binary = tmp_path / "bin" / "gpuhost-agent"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    (unit_dir / "gpuhost-agent.service").write_text(
        text.replace("ExecStart=/opt/gpuhost-agent/venv/bin/gpuhost-agent ", f"ExecStart={binary} ")
    )
    return unit_dir


def test_systemd_analyze_verify_passes_without_a_word(tmp_path: Path) -> None:
    analyze = _systemd_analyze()
    unit_dir = _copy_with_runnable_exec_start(tmp_path, UNIT.read_text())
    result = _verify(analyze, unit_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


def test_verify_would_catch_a_mistake(tmp_path: Path) -> None:
    """The check above has teeth: a misspelt directive is reported."""
    analyze = _systemd_analyze()
    unit_dir = _copy_with_runnable_exec_start(tmp_path, UNIT.read_text().replace("KillMode=mixed", "KilMode=mixed"))
    result = _verify(analyze, unit_dir)
    assert "KilMode" in result.stdout + result.stderr


def test_restart_back_off_drop_in_only_where_systemd_knows_it(tmp_path: Path) -> None:
    """install.sh writes RestartSteps= only for systemd >= 254; on such a
    systemd, the unit with that drop-in verifies cleanly too."""
    script = INSTALL_SH.read_text()
    assert '"$version" -ge 254' in script and "RestartSteps=" in script
    analyze = _systemd_analyze()
    version = int(
        re.search(
            r"systemd (\d+)", subprocess.run([analyze, "--version"], capture_output=True, text=True).stdout
        ).group(1)
    )
    if version < 254:
        pytest.skip(f"systemd {version} here predates RestartSteps= (254); the drop-in is not installed on it")
    unit_dir = _copy_with_runnable_exec_start(tmp_path, UNIT.read_text())
    dropin = unit_dir / "gpuhost-agent.service.d"
    dropin.mkdir()
    text = script.split("dropin_text() {\n    cat <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    (dropin / "10-install-restart-backoff.conf").write_text(text + "\n")
    result = _verify(analyze, unit_dir)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_exposure_as_systemd_analyze_security_scores_it(tmp_path: Path) -> None:
    """6.5 MEDIUM without the hardening, 4.0 OK with it (systemd 252's scale:
    0 is fully confined, 10 is a service with no hardening); 4.3 since the agent
    keeps the egress rules that confine every rental's containers (NET_ADMIN,
    NET_RAW), a cost in the agent's own confinement paid for
    the renters' and the host's."""
    analyze = _systemd_analyze()
    unit_dir = _copy_with_runnable_exec_start(tmp_path, UNIT.read_text())
    result = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", str(unit_dir / "gpuhost-agent.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("this systemd-analyze predates --offline (systemd 250)")
    score = re.search(r"Overall exposure level for gpuhost-agent\.service: (\d+\.\d+)", result.stdout)
    assert score, result.stdout + result.stderr
    assert float(score.group(1)) <= 4.3, result.stdout

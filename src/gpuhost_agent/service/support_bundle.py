"""`gpuhost-agent support-bundle`: one archive an operator attaches to a ticket.

It holds what support asks for first (versions, doctor, probe, status, the
agent's recent log, the engine's info, the unit and its drop-ins) and a
manifest that says what each file is and what could not be gathered and why:
a bundle is made on a broken host, so nothing missing stops it. Every file is
scrubbed of every secret the host's configuration can name (the API key, the
Swarm key, the local marketplace's keys, any GPUHOST_*KEY* value) and of what
looks like one (X-API-Key and Authorization values, Bearer tokens, PEM private
keys, passwords in URLs). Renters' data is left out: no state directory file
is read but the local marketplace's keys (never its stack folders), no
container of the engine is listed, and of the stacks `status` knows only ids,
rentals and states are kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import io
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import gpuhost_agent
from gpuhost_agent import __version__
from gpuhost_agent.common import lock_check
from gpuhost_agent.common.logs import MASK, SecretRegistry
from gpuhost_agent.common.visible import visible_tree
from gpuhost_agent.inventory import render
from gpuhost_agent.inventory.system_data import as_sent
from gpuhost_agent.protocol.wire_system import SystemDataReport
from gpuhost_agent.runtime.engine.client import DockerEngine
from gpuhost_agent.runtime.engine.errors import EngineError
from gpuhost_agent.service import settings_view
from gpuhost_agent.service.config import AgentConfig, Chosen, ConfigError, read_config_file
from gpuhost_agent.service.host_check import machine_report
from gpuhost_agent.service.settings_table import SETTINGS
from gpuhost_agent.service.status import cli as status_cli

UNIT_NAME = "gpuhost-agent"
JOURNAL_LINES = 50_000  # the newest lines kept when the period holds more
JOURNAL_SECONDS = 60.0
FILE_BYTES = 1 << 20  # a unit file or drop-in read at most this long
LOCAL_MARKETPLACE_FILE = "local-marketplace.json"  # in the state directory (service/wiring.py)
LOCAL_MARKETPLACE_KEYS = ("envApiKey", "renterApiKey", "tunnelSecret", "releaseKey")
SINCE = re.compile(r"\s*(\d+)\s*([smhdw])\s*")
SECONDS_PER = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
EXIT_OK, EXIT_NOT_WRITTEN, EXIT_USAGE = 0, 1, 2
NOT_SYSTEMD = "an agent not run by systemd, `make run`'s, logs to its stderr"


@dataclass(frozen=True)
class Places:
    """Where the host's own files and journal are read (install.sh writes the units there)."""

    unit: Path = Path("/etc/systemd/system/gpuhost-agent.service")
    unit_drop_ins: Path = Path("/etc/systemd/system/gpuhost-agent.service.d")
    docker_drop_in: Path = Path("/etc/systemd/system/docker.service.d/10-gpuhost-egress.conf")
    journalctl: str = "journalctl"


PLACES = Places()


@dataclass
class Bundle:
    """The files gathered (name in the archive, what it is, its text), and what was not, with why."""

    files: list[tuple[str, str, str]] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)

    def add(self, name: str, what: str, text: str) -> None:
        self.files.append((name, what, text))

    def lack(self, name: str, why: str) -> None:
        self.missing.append((name, why))


# ---- secrets ---------------------------------------------------------------------
_SECRET_ENV = re.compile(r"GPUHOST_[A-Z0-9_]*(?:KEY|SECRET|TOKEN|PASSWORD)[A-Z0-9_]*")
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # A PEM private key (the SSH host key, a Swarm TLS key): its body, whole (a key is a few KiB at most);
    # then one cut short: the rest of its line or JSON string (a log line quotes it), the base64 lines under it.
    (
        re.compile(r"(-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----)(?s:.{0,65536}?)(-----END \2PRIVATE KEY-----)"),
        rf"\1{MASK}\3",
    ),
    (
        re.compile(r"(-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----)(?!\*\*\*)[^\n\"]*(?:\n[A-Za-z0-9+/=]+(?=\n|\Z))*"),
        rf"\1{MASK}",
    ),
    # Headers and fields: X-API-Key: v, "Authorization": "Bearer v", proxy-authorization=Basic v.
    (
        re.compile(
            r"(?i)\b((?:x-api-key|(?:proxy-)?authorization)[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic|token)\s+)?)"
            r"[^\s\"',;}]+"
        ),
        rf"\1{MASK}",
    ),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), rf"\1{MASK}"),
    # GPUHOST_API_KEY=v, Environment="GPUHOST_SWARM_KEY=v" (a *_FILE names a path: kept).
    (re.compile(rf"\b({_SECRET_ENV.pattern})(?<!_FILE)(\s*[=:]\s*[\"']?)[^\s\"']+"), rf"\1\2{MASK}"),
    # A password in a URL: https://user:password@proxy:3128.
    (re.compile(r"\b([a-z][a-z0-9+.-]*://[^/\s:@\"']+:)[^@\s/\"']+@", re.IGNORECASE), rf"\1{MASK}@"),
)


@dataclass
class Secrets:
    """The secret values a bundle is scrubbed of, how many, and the sources that could not be read."""

    registry: SecretRegistry
    count: int
    notes: list[str]


def known_secrets(config: AgentConfig, chosen: Mapping[str, Chosen], environ: Mapping[str, str]) -> Secrets:
    """Every secret value this host's configuration names (never printed)."""
    values: list[str | None] = [config.api_key, config.swarm_key, config.local_api_key]
    values += [chosen[setting.name].text for setting in SETTINGS if setting.secret and setting.name in chosen]
    values += [value for name, value in environ.items() if _SECRET_ENV.fullmatch(name) and not name.endswith("_FILE")]
    notes: list[str] = []
    config_file = chosen["config"].text if "config" in chosen else None
    if config_file and Path(config_file).is_file():
        try:
            written = read_config_file(Path(config_file))
        except (OSError, ConfigError, UnicodeDecodeError) as exc:
            notes.append(f"the config file {config_file} could not be read for its keys: {exc}")
        else:
            values += [v for name, v in written.items() if _SECRET_ENV.fullmatch(name) and not name.endswith("_FILE")]
    store = config.state_dir / LOCAL_MARKETPLACE_FILE
    try:
        kept = json.loads(store.read_text()) if store.is_file() else {}
    except (OSError, ValueError) as exc:
        notes.append(f"the local marketplace's keys could not be read from {store}: {exc}")
        kept = {}
    if isinstance(kept, dict):
        values += [kept.get(name) for name in LOCAL_MARKETPLACE_KEYS if isinstance(kept.get(name), str)]
    registry, distinct = SecretRegistry(), {value for value in values if value}
    for value in distinct:
        registry.add(value, value.strip(), json.dumps(value)[1:-1])  # as written, and as JSON quotes it
    return Secrets(registry, len(distinct), notes)


def scrub(text: str, registry: SecretRegistry) -> str:
    """`text` without the registered values, nor anything that looks like a credential."""
    text = registry.scrub(text)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


# ---- what is kept of the answers (pure) ------------------------------------------
STACK_FIELDS = ("stackId", "rentalId", "status", "updatedAt")
RENTAL_FIELDS = ("rentalId", "endDate", "endedAt", "gpus")
ENGINE_FIELDS = (
    "ServerVersion", "OperatingSystem", "OSVersion", "OSType", "KernelVersion", "Architecture", "NCPU", "MemTotal",
    "Driver", "DriverStatus", "DockerRootDir", "CgroupDriver", "CgroupVersion", "LoggingDriver", "DefaultRuntime",
    "SecurityOptions", "LiveRestoreEnabled", "Containers", "ContainersRunning", "ContainersPaused",
    "ContainersStopped", "Images", "Warnings", "DefaultAddressPools", "CDISpecDirs", "ContainerdCommit",
    "RuncCommit", "InitCommit", "HttpProxy", "HttpsProxy", "NoProxy", "Debug", "ExperimentalBuild",
)  # fmt: skip
ENGINE_SWARM_FIELDS = ("LocalNodeState", "ControlAvailable", "Nodes", "Managers", "Error")
ENGINE_VERSION_FIELDS = ("Version", "ApiVersion", "MinAPIVersion", "GoVersion", "Os", "Arch", "KernelVersion")


def status_shown(status: dict) -> dict:
    """The running agent's status, its stacks and rentals cut to ids, states
    and times: a stack's name, project, error and tunnels are the renter's."""
    shown = {key: value for key, value in status.items() if key not in ("stacks", "rentals")}
    for key, kept in (("stacks", STACK_FIELDS), ("rentals", RENTAL_FIELDS)):
        entries = status.get(key)
        if isinstance(entries, list):
            shown[key] = [{name: entry.get(name) for name in kept} for entry in entries if isinstance(entry, dict)]
    return shown


def engine_shown(info: dict) -> dict:
    """The engine's own settings and counts from `docker info` and `docker
    version`; nothing of a container, and the daemon's labels left out."""
    shown = {key: info[key] for key in ENGINE_FIELDS if key in info}
    if isinstance(info.get("Runtimes"), dict):
        shown["Runtimes"] = sorted(info["Runtimes"])
    if isinstance(info.get("Plugins"), dict):
        shown["Plugins"] = info["Plugins"]
    if isinstance(info.get("Swarm"), dict):
        shown["Swarm"] = {key: info["Swarm"][key] for key in ENGINE_SWARM_FIELDS if key in info["Swarm"]}
    version = info.get("Version")
    if isinstance(version, dict):
        shown["Version"] = {key: version[key] for key in ENGINE_VERSION_FIELDS if key in version}
        components = version.get("Components")
        if isinstance(components, list):
            shown["Version"]["Components"] = [
                {"Name": c.get("Name"), "Version": c.get("Version")} for c in components if isinstance(c, dict)
            ]
    return shown


def versions_text(report: SystemDataReport | None, lock: tuple[Path, str] | None, lock_verdict: list[str]) -> str:
    """One line each: the agent, Python, the lock, the driver, Docker, Compose, the kernel."""
    data = (report or {}).get("systemData") or {}
    host, nvml = data.get("host") or {}, data.get("nvml") or {}
    docker, compose, system = host.get("docker") or {}, host.get("compose") or {}, host.get("os") or {}

    def said(value: Any, error: Any) -> str:
        return str(value) if value else f"unknown ({error or 'not probed'})"

    lines = [
        f"agent: {__version__} ({Path(gpuhost_agent.__file__).parent})",
        f"python: {platform.python_version()} ({sys.executable})",
        f"lock: {lock[0]} sha256 {hashlib.sha256(lock[1].encode()).hexdigest()}" if lock else "lock: not found",
        *[f"  {line}" for line in lock_verdict],
        f"nvidia driver: {said(nvml.get('driverVersion'), nvml.get('error'))}"
        + (f" (CUDA {nvml['cudaDriverVersion']})" if nvml.get("cudaDriverVersion") else ""),
        f"docker engine: {said(docker.get('version'), docker.get('error'))}",
        f"compose: {said(compose.get('version'), compose.get('error'))}"
        + (f" ({compose['command']})" if compose.get("command") else ""),
        f"kernel: {system.get('kernel') or platform.release()}",
        f"os: {system.get('name') or platform.platform()} {system.get('arch') or platform.machine()}",
    ]
    return "\n".join(lines) + "\n"


def parse_since(text: str) -> timedelta:
    """`24h`, `90m`, `7d`, `2w`, `3600s`: how far back the log goes."""
    match = SINCE.fullmatch(text)
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"--since {text!r}: expected a number and a unit, s, m, h, d or w (24h, 90m, 7d)")
    return timedelta(seconds=int(match.group(1)) * SECONDS_PER[match.group(2)])


# ---- gathering (I/O) -------------------------------------------------------------
async def _probe_and_engine(config: AgentConfig) -> tuple[SystemDataReport | str, dict | str]:
    """The probe's report and the engine's info, each or why not."""
    try:
        report: SystemDataReport | str = await machine_report(config)
    except Exception as exc:  # a bundle is made on broken hosts: say why, go on
        report = f"{type(exc).__name__}: {exc}"
    engine = DockerEngine(timeout=10)
    try:
        info: dict | str = await engine.info()
    except EngineError as exc:
        info = str(exc)
    finally:
        await engine.close()
    return report, info


def _lock() -> tuple[tuple[Path, str] | None, list[str]]:
    """The installed agent's lock (a checkout's requirements/ else), and whether what is installed matches it."""
    for path in (Path(gpuhost_agent.__file__).with_name("agent.lock"), status_cli.CHECKOUT / "requirements/agent.lock"):
        try:
            text = path.read_text()
        except OSError:
            continue
        pins = lock_check.locked(text, platform.python_version())
        installed = {lock_check.canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
        wrong = [
            f"{name}: locked {version}, installed {installed.get(name, 'nothing')}"
            for name, version in sorted(pins.items())
            if installed.get(name) != version
        ]
        return (path, text), wrong or [f"all {len(pins)} packages it names for this Python are at their versions"]
    return None, []


def _status(config: AgentConfig) -> tuple[dict | None, str]:
    try:
        answer = status_cli.fetch_json(config.socket_path, "/status")
    except status_cli.StatusUnavailable as exc:
        return None, str(exc)
    if not isinstance(answer, dict):
        return None, f"the agent's /status on {config.socket_path} is not a JSON object"
    return answer, ""


def _journal(since_at: datetime, places: Places) -> tuple[str | None, str]:
    """The agent's log lines since `since_at`, or None and why; the second value: a note on them."""
    command = shutil.which(places.journalctl)
    if command is None:
        return None, f"journalctl is not on this machine ({NOT_SYSTEMD})"
    argv = [command, "-u", UNIT_NAME, "--since", f"@{int(since_at.timestamp())}", "-o", "cat"]
    argv += ["--no-pager", "-q", "-n", str(JOURNAL_LINES)]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=JOURNAL_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"journalctl failed: {exc}"
    said = done.stderr.decode("utf-8", "replace").strip()[-500:]
    if done.returncode != 0:
        return None, f"journalctl exited with status {done.returncode}: {said}"
    text = done.stdout.decode("utf-8", "replace")
    if not text.strip():
        why = f"the journal holds no line of unit {UNIT_NAME} since {since_at.isoformat()}"
        return None, f"{why} ({said or NOT_SYSTEMD})"
    lines = text.count("\n")
    note = f"the newest {JOURNAL_LINES} lines only" if lines >= JOURNAL_LINES else f"{lines} lines"
    return text, f"{note}; {said}" if said else note


def _read_small(path: Path) -> str:
    with path.open("rb") as handle:
        return handle.read(FILE_BYTES).decode("utf-8", "replace")


def _units(bundle: Bundle, places: Places) -> None:
    """The agent's unit, its drop-ins, and the egress drop-in of Docker's unit, as on disk."""

    def read(path: Path, name: str, what: str) -> None:
        try:
            bundle.add(name, f"{what}: {path}", _read_small(path))
        except OSError as exc:
            bundle.lack(name, f"{path}: {exc.strerror or exc}")

    read(places.unit, f"systemd/{places.unit.name}", "the agent's systemd unit (install.sh writes it)")
    folder = f"systemd/{places.unit_drop_ins.name}"
    try:
        drop_ins = sorted(path for path in places.unit_drop_ins.iterdir() if path.is_file())
    except OSError as exc:
        bundle.lack(f"{folder}/", f"{places.unit_drop_ins}: {exc.strerror or exc}")
        drop_ins = []
    for path in drop_ins:
        read(path, f"{folder}/{path.name}", "a drop-in of the agent's unit")
    docker = places.docker_drop_in
    read(docker, f"systemd/{docker.parent.name}/{docker.name}", "Docker's drop-in: the egress rules before dockerd")


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str) + "\n"


def gather(
    config: AgentConfig,
    since: timedelta,
    settings: list[dict[str, str]],
    whose: str,
    places: Places,
    now: datetime,
) -> Bundle:
    """Everything the bundle holds, unscrubbed; what cannot be had is listed with why."""
    bundle = Bundle()
    report, info = asyncio.run(_probe_and_engine(config))
    lock, verdict = _lock()
    versions = versions_text(report if isinstance(report, dict) else None, lock, verdict)
    bundle.add("versions.txt", "versions: agent, Python, the lock, NVIDIA driver, Docker, Compose, kernel", versions)
    if lock:
        bundle.add("agent.lock", f"the lock the agent's dependencies are installed from: {lock[0]}", lock[1])
    else:
        bundle.lack("agent.lock", "no agent.lock beside the installed package")
    if isinstance(report, dict):
        compliance = report["compliance"]
        verdict_line = "compliant" if compliance.get("isCompliant") else "NOT compliant (doctor exits 1)"
        doctor = render.doctor_lines(visible_tree(compliance["checks"]))
        doctor += f"\n\n{verdict_line}\n\n{settings_view.lines(settings, whose)}\n"
        bundle.add("doctor.txt", "`gpuhost-agent doctor`: the compliance checks, and the settings, keys masked", doctor)
        bundle.add("probe.json", "`gpuhost-agent probe --json`: the systemData the agent sends", _json(as_sent(report)))
    else:
        bundle.lack("doctor.txt", f"the probe failed: {report}")
        bundle.lack("probe.json", f"the probe failed: {report}")
    status, why = _status(config)
    if status is not None:
        shown = _json(status_shown(status))
        bundle.add("status.json", "`gpuhost-agent status --json`, its stacks cut to ids and states", shown)
    else:
        bundle.lack("status.json", why)
    if isinstance(info, dict):
        bundle.add("engine.json", "the Docker Engine's info and version, no container", _json(engine_shown(info)))
    else:
        bundle.lack("engine.json", info)
    since_at = now - since
    log, note = _journal(since_at, places)
    if log is not None:
        what = f"the agent's log: journalctl -u {UNIT_NAME} -o cat since {since_at.isoformat()} ({note})"
        bundle.add("agent-log.txt", what, log)
    else:
        bundle.lack("agent-log.txt", note)
    _units(bundle, places)
    return bundle


# ---- the archive -----------------------------------------------------------------
def archive(bundle: Bundle, registry: SecretRegistry, folder: str, manifest: dict, mtime: float) -> bytes:
    """The gzipped tar: the manifest, then each file, every one scrubbed, 0600, root's."""
    manifest = {
        **manifest,
        "files": [{"name": "manifest.json", "what": "this list"}]
        + [{"name": name, "what": what} for name, what, _ in bundle.files],
        "notGathered": [{"name": name, "why": why} for name, why in bundle.missing],
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, text in [("manifest.json", _json(manifest)), *[(name, text) for name, _, text in bundle.files]]:
            data = scrub(text, registry).encode()
            member = tarfile.TarInfo(f"{folder}/{name}")
            member.size, member.mode, member.mtime = len(data), 0o600, int(mtime)
            tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def _write(path: Path, data: bytes) -> None:
    """A new file, 0600 whatever the umask; never one that is there (or a link)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            descriptor = -1
            handle.write(data)
    except BaseException:
        if descriptor >= 0:
            os.close(descriptor)
        path.unlink(missing_ok=True)
        raise


def run(
    config: AgentConfig,
    chosen: Mapping[str, Chosen],
    *,
    since: str,
    output: str | None,
    settings: list[dict[str, str]],
    whose: str,
    places: Places | None = None,
) -> int:
    """The command: writes the archive, prints its path; 1 when it cannot be written, 2 for a bad --since."""
    try:
        period = parse_since(since)
    except ValueError as exc:
        print(f"gpuhost-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    now = datetime.now(timezone.utc)
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"
    folder = f"gpuhost-support-{host}-{now.strftime('%Y%m%dT%H%M%SZ')}"
    path = Path(output) if output else Path(f"{folder}.tar.gz")
    secrets = known_secrets(config, chosen, os.environ)
    bundle = gather(config, period, settings, whose, places or PLACES, now)
    manifest = {
        "bundle": folder,
        "createdAt": now.isoformat(),
        "host": socket.gethostname(),
        "agentVersion": __version__,
        "since": since,
        "sinceAt": (now - period).isoformat(),
        "scrubbed": f"every file: {secrets.count} secret values the configuration names (API key, "
        "Swarm key, local marketplace keys, GPUHOST_*KEY*) and anything like X-API-Key, Authorization, Bearer, "
        f"PEM private keys, URL passwords, replaced by {MASK}",
        "leftOut": "renters' data: their containers' logs, Compose files and values (the state directory's stacks), "
        "stacks' names and errors; the engine's container list",
        "notes": secrets.notes,
    }
    data = archive(bundle, secrets.registry, folder, manifest, time.time())
    try:
        _write(path, data)
    except OSError as exc:
        print(f"gpuhost-agent: support bundle not written to {path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_NOT_WRITTEN
    print(path)
    for name, why in bundle.missing:
        print(f"  not gathered: {name}: {scrub(why, secrets.registry)}", file=sys.stderr)
    return EXIT_OK

"""install.sh on a fresh Debian 12, and the marketplace's installation line pasted there.
(--help, options and the script routes alone: tests/unit/test_install_script.py.)

Each scenario is a throw-away chroot over a cached Debian 12 root file system
(scripts/rootfs-debian12.sh: debootstrap from the Debian mirror this machine
uses, built once into tests/.rootfs/, about a minute) entered through
scripts/install-test-chroot.sh (an overlay in a private mount namespace).
systemd is installed there but not running, like in any chroot.

The agent is pip-installed there from a wheelhouse (scripts/rootfs-wheelhouse.sh:
.venv's pinned dependencies as wheels, cached in tests/.rootfs/wheels, plus the
agent's wheel built from this checkout) with PIP_NO_INDEX, so an install takes
seconds and the suite does not depend on the package index after the first run.

Docker, Compose, the NVIDIA driver and toolkit are stand-ins (small scripts in
/usr/local/bin that answer what install.sh asks and log their calls), present
or absent per scenario; apt-get/apt-cache are stand-ins too (candidates and
what "installing" does are set per scenario), so no test touches a real
package archive from inside the chroot. A stand-in systemctl (systemd 255)
with /run/systemd/system plays a booted host where one is needed.

Needs root (chroot, mounts).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from support.install_script import allowed, msg, too_old
from support.openapi_check import AGENT_DOC, check_named, load

from gpuhost_agent import __version__
from gpuhost_agent.local_marketplace.server import build_app
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import wire

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SH = ROOT / "install.sh"
UNIT = ROOT / "systemd" / "gpuhost-agent.service"
ROOTFS = ROOT / "tests" / ".rootfs" / "debian12"
WHEELS = ROOT / "tests" / ".rootfs" / "wheels"
CHROOT = ROOT / "scripts" / "install-test-chroot.sh"
CHECKOUT_IN_ROOT = "/root/gpuhost-agent"
URL = "http://127.0.0.1:9/v1"  # the discard port: reports fail fast, as with an unreachable marketplace
ENV_ID = "env-0f3c"
KEY = "envkey_S3cr3t_d0_n0t_print_9b7e"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="install.sh tests need root (chroot and mounts)")


# ---- the chroot scenarios -----------------------------------------------------------


@pytest.fixture(scope="session")
def rootfs() -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "rootfs-debian12.sh"), str(ROOTFS)], capture_output=True, text=True, timeout=900
    )
    assert built.returncode == 0, f"building the Debian 12 rootfs failed:\n{built.stdout}\n{built.stderr}"
    return ROOTFS


@pytest.fixture(scope="session")
def agent_wheels(tmp_path_factory) -> Path:
    """The dependency wheelhouse (cached) and a wheel of the agent as it is now."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    out = tmp_path_factory.mktemp("agent-wheel")
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "rootfs-wheelhouse.sh"), "--agent-wheel", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, f"building the wheelhouse failed:\n{built.stdout}\n{built.stderr}"
    assert list(out.glob("gpuhost_agent-*.whl"))
    return out


FAKE_DOCKER = r"""#!/bin/sh
# stand-in for the Docker CLI (test_install.py)
echo "docker $*" >>/var/log/fake-calls.log
case "$1" in
    version)
        if [ -e /etc/fake/docker-down ]; then
            echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2
            exit 1
        fi
        cat /etc/fake/docker-version 2>/dev/null || echo 27.3.1 ;;
    compose)
        [ -e /etc/fake/compose ] || { echo "docker: 'compose' is not a docker command." >&2; exit 1; }
        cat /etc/fake/compose-version 2>/dev/null || echo 2.29.1 ;;
esac
"""
FAKE_NVIDIA_SMI = r"""#!/bin/sh
echo "nvidia-smi $*" >>/var/log/fake-calls.log
if [ -e /etc/fake/nvidia-broken ]; then
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
    exit 9
fi
driver=$(cat /etc/fake/driver-version 2>/dev/null || echo 550.54.15)
case "$*" in
    *--query-gpu*) printf 'NVIDIA H100 80GB HBM3, %s\nNVIDIA H100 80GB HBM3, %s\n' "$driver" "$driver" ;;
    *) printf '| NVIDIA-SMI %s    Driver Version: %s    CUDA Version: %s |\n' "$driver" "$driver" \
           "$(cat /etc/fake/cuda-version 2>/dev/null || echo 12.4)" ;;
esac
"""
FAKE_NVIDIA_CTK = r"""#!/bin/sh
echo "nvidia-ctk $*" >>/var/log/fake-calls.log
echo "NVIDIA Container Toolkit CLI version $(cat /etc/fake/toolkit-version 2>/dev/null || echo 1.17.8)"
echo "commit: 0123456"
"""
# apt stand-ins: candidates listed in /etc/fake/apt-candidates; "installing"
# one runs /etc/fake/apt-hooks/<package> when there is such a hook.
FAKE_APT_GET = r"""#!/bin/sh
echo "apt-get $*" >>/var/log/fake-calls.log
[ "$1" = update ] && exit 0
[ "$1" = install ] || exit 0
shift
for pkg in "$@"; do
    case "$pkg" in -*) continue ;; esac
    if ! grep -qx "$pkg" /etc/fake/apt-candidates 2>/dev/null; then
        echo "E: Unable to locate package $pkg" >&2
        exit 100
    fi
    if [ -x "/etc/fake/apt-hooks/$pkg" ]; then "/etc/fake/apt-hooks/$pkg" || exit 100; fi
done
"""
FAKE_APT_CACHE = r"""#!/bin/sh
[ "$1" = policy ] || exit 0
if grep -qx "$2" /etc/fake/apt-candidates 2>/dev/null; then
    printf '%s:\n  Installed: (none)\n  Candidate: 2.29.1-1\n' "$2"
fi
"""
FAKE_SYSTEMCTL = r"""#!/bin/sh
# stand-in for a running systemd 255
echo "systemctl $*" >>/var/log/fake-calls.log
case "$1" in
    --version) echo "systemd 255 (255.4-1ubuntu8)"; echo "+PAM +AUDIT" ;;
    is-active) echo active ;;
esac
"""
FAKE_SUDO = '#!/bin/sh\nexec "$@"\n'
FAKE_CURL = '#!/bin/sh\necho "curl $*" >>/var/log/fake-calls.log\nexec /usr/bin/curl "$@"\n'


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def both(self) -> str:
        return self.out + self.err


class Scenario:
    """One throw-away Debian 12 chroot; its changes live in `path` between calls."""

    def __init__(self, rootfs: Path, path: Path, wheels: Path):
        self.rootfs, self.path, self.wheels = rootfs, path, wheels

    def run(
        self,
        *command: str,
        env: dict[str, str] | None = None,
        binds: dict[str, Path] | None = None,
        input: str | None = None,
        timeout: float = 600,
    ) -> Run:
        args = ["bash", str(CHROOT), str(self.rootfs), str(self.path)]
        for dest, src in {"/wheels": WHEELS, "/agent-wheels": self.wheels, **(binds or {})}.items():
            args += ["--bind", f"{src}:{dest}"]
        for key, value in {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wheels /agent-wheels", **(env or {})}.items():
            args += ["--env", f"{key}={value}"]
        result = subprocess.run([*args, "--", *command], capture_output=True, text=True, input=input, timeout=timeout)
        return Run(result.returncode, result.stdout, result.stderr)

    def sh(self, script: str, **kwargs) -> Run:
        result = self.run("/bin/sh", "-ec", script, **kwargs)
        assert result.code == 0, f"{script}\n{result.both}"
        return result

    def install(self, *args: str, **kwargs) -> Run:
        return self.run(f"{CHECKOUT_IN_ROOT}/install.sh", *args, **kwargs)

    def files(self, *paths: str) -> dict[str, dict | None]:
        """mode, owner, kind (and link target) of each path, None when missing."""
        code = (
            "import json, os, stat, sys\n"
            "out = {}\n"
            "for p in sys.argv[1:]:\n"
            "    try: st = os.lstat(p)\n"
            "    except FileNotFoundError: out[p] = None; continue\n"
            "    kind = 'link' if stat.S_ISLNK(st.st_mode) else 'dir' if stat.S_ISDIR(st.st_mode) else 'file'\n"
            "    out[p] = {'mode': oct(st.st_mode & 0o7777), 'uid': st.st_uid, 'gid': st.st_gid, 'kind': kind,\n"
            "              'target': os.readlink(p) if kind == 'link' else None}\n"
            "print(json.dumps(out))\n"
        )
        return json.loads(self.run("python3", "-c", code, *paths).out)

    def read(self, path: str) -> str | None:
        result = self.run("cat", path)
        return result.out if result.code == 0 else None

    def calls(self) -> list[str]:
        return (self.read("/var/log/fake-calls.log") or "").splitlines()

    def tree(self) -> set[str]:
        """Every path with its mode, size and mtime, for "nothing changed" checks
        (/var/log left out: the stand-ins log their calls there)."""
        listing = self.run(
            "find",
            "/",
            "-xdev",
            "(",
            "-path",
            "/proc",
            "-o",
            "-path",
            "/tmp",
            "-o",
            "-path",
            "/var/log",
            ")",
            "-prune",
            "-o",
            "-printf",
            "%p %m %s %T@\n",
        ).out
        return set(listing.splitlines())


@pytest.fixture
def scenario(rootfs, agent_wheels, tmp_path):
    """A fresh chroot with this checkout in /root/gpuhost-agent and the apt stand-ins."""
    made = Scenario(rootfs, tmp_path / "root", agent_wheels)
    stage = tmp_path / "stage"
    for name, text in {"apt-get": FAKE_APT_GET, "apt-cache": FAKE_APT_CACHE}.items():
        (stage / "sbin").mkdir(parents=True, exist_ok=True)
        (stage / "sbin" / name).write_text(text)
    for name, text in {
        "docker": FAKE_DOCKER,
        "nvidia-smi": FAKE_NVIDIA_SMI,
        "nvidia-ctk": FAKE_NVIDIA_CTK,
        "systemctl": FAKE_SYSTEMCTL,
        "sudo": FAKE_SUDO,
        "curl": FAKE_CURL,
    }.items():
        (stage / "fakes").mkdir(exist_ok=True)
        (stage / "fakes" / name).write_text(text)
    made.sh(
        "mkdir -p /etc/fake/apt-hooks /usr/local/share/fake /var/log\n"
        "install -m 0755 /stage/sbin/* /usr/local/sbin/\n"
        "install -m 0755 /stage/fakes/* /usr/local/share/fake/\n"
        f"mkdir -p {CHECKOUT_IN_ROOT}\n"
        f"tar -C /checkout --exclude=__pycache__ --exclude='*.egg-info' -cf - pyproject.toml README.md src "
        f"install.sh systemd | tar -C {CHECKOUT_IN_ROOT} -xf -\n",
        binds={"/stage": stage, "/checkout": ROOT},
    )
    yield made
    # An installed scenario holds a venv of ~150 MB: do not leave it to pytest's tmp retention.
    subprocess.run(["rm", "-rf", "--one-file-system", str(made.path)], check=False)


def add(scenario: Scenario, *names: str) -> None:
    """Put stand-ins in place: docker, compose, nvidia (driver), toolkit, systemd (running), sudo, curl."""
    lines = []
    for name in names:
        if name == "compose":
            lines.append("touch /etc/fake/compose")
        elif name == "nvidia":
            lines += [
                "install -m 0755 /usr/local/share/fake/nvidia-smi /usr/local/bin/",
                "touch /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            ]
        elif name == "toolkit":
            lines.append("install -m 0755 /usr/local/share/fake/nvidia-ctk /usr/local/bin/")
        elif name == "systemd":
            lines += ["install -m 0755 /usr/local/share/fake/systemctl /usr/local/bin/", "mkdir -p /run/systemd/system"]
        else:
            lines.append(f"install -m 0755 /usr/local/share/fake/{name} /usr/local/bin/")
    scenario.sh("\n".join(lines))


def assert_not_installed(scenario: Scenario) -> None:
    found = scenario.files(
        "/opt/gpuhost-agent",
        "/etc/gpuhost-agent",
        "/var/lib/gpuhost-agent",
        "/etc/systemd/system/gpuhost-agent.service",
        "/usr/local/bin/gpuhost-agent",
    )
    assert all(value is None for value in found.values()), found


# ---- missing prerequisites ------------------------------------------------------------


@needs_root
def test_a_bare_debian_stops_with_what_is_missing_and_changes_nothing(scenario: Scenario) -> None:
    result = scenario.install("--url", URL, "--env-id", ENV_ID, "--api-key", KEY)
    assert result.code == 3, result.both
    for prefix in ("Docker Engine is not installed", "NVIDIA driver not found", "NVIDIA Container Toolkit not found"):
        assert f"install.sh: error: {msg(prefix)}\n" in result.err, (prefix, result.err)
    assert f"install.sh: warning: {msg('Docker Compose v2 is missing')}\n" in result.err
    assert "nothing was changed" in result.err
    assert KEY not in result.both
    assert_not_installed(scenario)


@needs_root
def test_each_missing_piece_has_its_documented_message(scenario: Scenario) -> None:
    add(scenario, "docker", "compose", "nvidia", "toolkit")
    args = ("--url", URL, "--env-id", ENV_ID, "--api-key", KEY)
    cases = [
        ("touch /etc/fake/docker-down", "error", "Docker Engine does not answer", "rm /etc/fake/docker-down"),
        ("touch /etc/fake/nvidia-broken", "error", "nvidia-smi is installed but fails", "rm /etc/fake/nvidia-broken"),
        (
            "rm /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            "error",
            "NVIDIA driver not found",
            "touch /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        ),
        (
            "rm /usr/local/bin/nvidia-ctk",
            "error",
            "NVIDIA Container Toolkit not found",
            "install -m 0755 /usr/local/share/fake/nvidia-ctk /usr/local/bin/",
        ),
        ("dpkg -r python3-venv python3.11-venv >/dev/null", "error", "python3 (3.10 or later)", "true"),
    ]
    for break_it, level, prefix, repair in cases:
        scenario.sh(break_it)
        result = scenario.install(*args)
        assert result.code == 3, (prefix, result.both)
        assert f"install.sh: {level}: {msg(prefix)}\n" in result.err, (prefix, result.err)
        assert result.err.count("install.sh: error:") == 1, (prefix, result.err)
        scenario.sh(repair)
    assert_not_installed(scenario)


@needs_root
def test_without_root_it_says_how_to_run_it(scenario: Scenario) -> None:
    scenario.sh(f"install -m 0755 {CHECKOUT_IN_ROOT}/install.sh /usr/local/share/install.sh")  # /root is 0700
    result = scenario.run(
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "/usr/local/share/install.sh",
        "--url",
        URL,
        "--env-id",
        ENV_ID,
        "--api-key",
        KEY,
    )
    assert result.code == 3
    assert f"install.sh: error: {msg('install.sh must run as root')}\n" in result.err


@needs_root
def test_allow_no_gpu_makes_the_gpu_pieces_warnings_and_old_versions_are_flagged(scenario: Scenario) -> None:
    add(scenario, "docker", "compose")
    scenario.sh("touch /etc/fake/docker-down")
    result = scenario.install("--url", URL, "--env-id", ENV_ID, "--api-key", KEY, "--allow-no-gpu")
    assert result.code == 3  # Docker is still required
    # Warnings now, and none tells the host to pass the --allow-no-gpu it passed (issue 18, item 3).
    assert f"install.sh: warning: {allowed(msg('NVIDIA driver not found'))}\n" in result.err
    assert f"install.sh: warning: {allowed(msg('NVIDIA Container Toolkit not found'))}\n" in result.err
    assert "--allow-no-gpu" not in result.err
    assert result.err.count("install.sh: error:") == 1 and msg("Docker Engine does not answer") in result.err

    # Every version below doctor's minimum is a warning, worded as doctor words it (issue 18, item 3).
    scenario.sh(
        "rm /etc/fake/docker-down; echo 1.16.2 >/etc/fake/toolkit-version\n"
        "echo 20.10.24+dfsg1 >/etc/fake/docker-version; echo 2.12.2 >/etc/fake/compose-version\n"
        "echo 470.239.06 >/etc/fake/driver-version; echo 11.4 >/etc/fake/cuda-version"
    )
    add(scenario, "nvidia", "toolkit")
    result = scenario.install("--url", URL, "--env-id", ENV_ID, "--api-key", KEY, "--dry-run")
    assert result.code == 0, result.both
    for prefix, found in (
        ("NVIDIA driver VERSION", "470.239.06"),
        ("the driver's CUDA VERSION", "11.4"),
        ("NVIDIA Container Toolkit VERSION", "1.16.2"),
        ("Docker Engine VERSION", "20.10.24+dfsg1"),
        ("Docker Compose VERSION", "2.12.2"),
    ):
        assert f"install.sh: warning: {too_old(prefix, found)}\n" in result.err, (prefix, result.err)
    assert "install.sh: error:" not in result.err

    # At the minimums: no warning.
    scenario.sh(
        "echo 1.17.8 >/etc/fake/toolkit-version; echo 24.0.7 >/etc/fake/docker-version\n"
        "echo 2.20.0 >/etc/fake/compose-version; echo 535.183.01 >/etc/fake/driver-version\n"
        "echo 12.2 >/etc/fake/cuda-version"
    )
    result = scenario.install("--url", URL, "--env-id", ENV_ID, "--api-key", KEY, "--dry-run")
    assert result.code == 0 and "is older than" not in result.err, result.both


@needs_root
def test_a_first_install_needs_url_env_id_and_key(scenario: Scenario) -> None:
    add(scenario, "docker", "compose", "nvidia", "toolkit")
    for args in (
        (),
        ("--url", URL, "--env-id", ENV_ID),
        ("--url", "http://m.example/api", "--env-id", ENV_ID, "--api-key", KEY),
    ):
        result = scenario.install(*args)
        assert result.code == 2, (args, result.both)
        assert KEY not in result.both
    assert_not_installed(scenario)


@needs_root
def test_install_missing_asks_apt_and_dry_run_only_says_so(scenario: Scenario) -> None:
    scenario.sh("printf 'docker.io\\nnvidia-container-toolkit\\n' >/etc/fake/apt-candidates")
    add(scenario, "nvidia")
    before = scenario.tree()
    result = scenario.install("--url", URL, "--env-id", ENV_ID, "--api-key", KEY, "--install-missing", "--dry-run")
    assert result.code == 0, result.both
    assert (
        "would run: env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        "docker.io nvidia-container-toolkit" in result.out
    )
    assert not [call for call in scenario.calls() if call.startswith("apt-get install")]
    assert scenario.tree() == before


# ---- install, upgrade, uninstall -----------------------------------------------------------

INSTALLED = (
    "/opt/gpuhost-agent/venv/bin/gpuhost-agent",
    "/usr/local/bin/gpuhost-agent",
    "/etc/gpuhost-agent",
    "/etc/gpuhost-agent/agent.conf",
    "/etc/gpuhost-agent/api-key",
    "/var/lib/gpuhost-agent",
    "/etc/systemd/system/gpuhost-agent.service",
    "/etc/systemd/system/gpuhost-agent.service.d/10-install-restart-backoff.conf",
)


def conf_values(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


@needs_root
def test_install_upgrade_and_uninstall_on_a_booted_host(scenario: Scenario) -> None:
    add(scenario, "docker", "nvidia", "toolkit", "systemd")
    # Compose is missing; apt has Docker's plugin, and "installing" it makes `docker compose` work.
    scenario.sh(
        "echo docker-compose-plugin >/etc/fake/apt-candidates\n"
        "printf '#!/bin/sh\\ntouch /etc/fake/compose\\n' >/etc/fake/apt-hooks/docker-compose-plugin\n"
        "chmod +x /etc/fake/apt-hooks/docker-compose-plugin"
    )
    args = ("--url", URL, "--env-id", ENV_ID, "--api-key", KEY)

    # --dry-run: says what it would do, changes nothing, shows no key.
    before = scenario.tree()
    dry = scenario.install(*args, "--dry-run")
    assert dry.code == 0, dry.both
    for expected in (
        "would run: python3 -m venv /opt/gpuhost-agent/venv",
        f"would run: /opt/gpuhost-agent/venv/bin/python -m pip install --upgrade --quiet "
        f"--disable-pip-version-check {CHECKOUT_IN_ROOT}",
        "would: writing /etc/gpuhost-agent",
        "would: installing the unit",
        "would run: env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        "docker-compose-plugin",
        "would run: systemctl restart --no-block gpuhost-agent.service",
        "nothing was changed",
    ):
        assert expected in dry.out, (expected, dry.out)
    assert KEY not in dry.both
    assert scenario.tree() == before
    assert not [call for call in scenario.calls() if call.startswith(("apt-get install", "systemctl enable"))]

    # First install, from the checkout.
    first = scenario.install(*args)
    assert first.code == 0, first.both
    assert KEY not in first.both
    assert "cannot reach the marketplace" in first.err  # and it went on regardless
    files = scenario.files(*INSTALLED)
    assert all(files[path] is not None for path in INSTALLED), files
    assert files["/etc/gpuhost-agent"]["mode"] == "0o750"
    assert files["/etc/gpuhost-agent/agent.conf"]["mode"] == "0o640"
    assert files["/etc/gpuhost-agent/api-key"]["mode"] == "0o600"
    assert files["/var/lib/gpuhost-agent"]["mode"] == "0o700"
    assert files["/etc/systemd/system/gpuhost-agent.service"]["mode"] == "0o644"
    assert all(files[path]["uid"] == 0 and files[path]["gid"] == 0 for path in INSTALLED)
    assert files["/usr/local/bin/gpuhost-agent"]["target"] == "/opt/gpuhost-agent/venv/bin/gpuhost-agent"
    assert scenario.read("/etc/gpuhost-agent/api-key") == KEY + "\n"
    conf = conf_values(scenario.read("/etc/gpuhost-agent/agent.conf"))
    assert conf == {
        "GPUHOST_MARKETPLACE_URL": URL,
        "GPUHOST_ENV_ID": ENV_ID,
        "GPUHOST_API_KEY_FILE": "/etc/gpuhost-agent/api-key",
        "GPUHOST_STATE_DIR": "/var/lib/gpuhost-agent",
    }
    assert scenario.read("/etc/systemd/system/gpuhost-agent.service") == UNIT.read_text()
    assert "RestartSteps=" in scenario.read(INSTALLED[-1])  # the stand-in says systemd 255
    assert scenario.run("gpuhost-agent", "version").out.strip() == __version__
    # The agent's own config loader reads what was written, key file included.
    loaded = scenario.run(
        "/opt/gpuhost-agent/venv/bin/python",
        "-c",
        "from gpuhost_agent.service import config; c = config.load({});"
        "print(c.marketplace_url, c.env_id, c.api_key == open('/etc/gpuhost-agent/api-key')"
        ".read().strip(), c.state_dir)",
    )
    assert loaded.out.split() == [URL, ENV_ID, "True", "/var/lib/gpuhost-agent"], loaded.both
    # The key is in its file and nowhere else on disk.
    holders = scenario.run("grep", "-rlF", KEY, "/etc", "/opt", "/var", "/root", "/usr/local").out.split()
    assert holders == ["/etc/gpuhost-agent/api-key"], holders
    calls = scenario.calls()
    assert "apt-get install -y -qq --no-install-recommends docker-compose-plugin" in calls
    for call in (
        "systemctl daemon-reload",
        "systemctl enable gpuhost-agent.service",
        "systemctl restart --no-block gpuhost-agent.service",
    ):
        assert call in calls, (call, calls)
    assert "gpuhost-agent.service is running" in first.out

    # Second install, no arguments: upgrades in place, keeps state and the host's lines.
    scenario.sh(
        "echo 'GPUHOST_LOCATION=DE-Frankfurt' >>/etc/gpuhost-agent/agent.conf\n"
        "echo '# mine' >>/etc/gpuhost-agent/agent.conf\n"
        "echo stacks >/var/lib/gpuhost-agent/keep.json\n"
        "touch /opt/gpuhost-agent/venv/marker\n"
        "chmod 0644 /etc/gpuhost-agent/api-key\n"
        ": >/var/log/fake-calls.log"
    )
    second = scenario.install()
    assert second.code == 0, second.both
    assert "upgrading the agent in place" in second.out
    assert "keeping the state directory /var/lib/gpuhost-agent" in second.out
    text = scenario.read("/etc/gpuhost-agent/agent.conf")
    assert conf_values(text) == {**conf, "GPUHOST_LOCATION": "DE-Frankfurt"} and "# mine\n" in text
    assert scenario.read("/var/lib/gpuhost-agent/keep.json") == "stacks\n"
    files = scenario.files("/opt/gpuhost-agent/venv/marker", "/etc/gpuhost-agent/api-key")
    assert files["/opt/gpuhost-agent/venv/marker"] is not None, "the venv was recreated, not upgraded"
    assert files["/etc/gpuhost-agent/api-key"]["mode"] == "0o600"
    assert scenario.read("/etc/gpuhost-agent/api-key") == KEY + "\n"
    calls = scenario.calls()
    assert not [call for call in calls if call.startswith("apt-get install")], "Compose is there now"
    assert "systemctl restart --no-block gpuhost-agent.service" in calls

    # A new key from a file (kept out of ps): rotated, nothing else changes.
    scenario.sh("umask 077; echo envkey_rotated_2 >/root/new-key")
    third = scenario.install("--api-key-file", "/root/new-key")
    assert third.code == 0, third.both
    assert scenario.read("/etc/gpuhost-agent/api-key") == "envkey_rotated_2\n"
    assert "envkey_rotated_2" not in third.both
    assert conf_values(scenario.read("/etc/gpuhost-agent/agent.conf"))["GPUHOST_ENV_ID"] == ENV_ID

    # Uninstall: the agent goes, configuration, state, containers and Docker stay.
    scenario.sh(": >/var/log/fake-calls.log")
    removed = scenario.install("--uninstall")
    assert removed.code == 0, removed.both
    assert f"install.sh: {msg('Renters')}\n" in removed.out
    files = scenario.files(*INSTALLED, "/opt/gpuhost-agent")
    gone = (
        "/opt/gpuhost-agent",
        "/opt/gpuhost-agent/venv/bin/gpuhost-agent",
        "/usr/local/bin/gpuhost-agent",
        "/etc/systemd/system/gpuhost-agent.service",
        INSTALLED[-1],
    )
    assert all(files[path] is None for path in gone), files
    assert all(
        files[path] is not None
        for path in ("/etc/gpuhost-agent/agent.conf", "/etc/gpuhost-agent/api-key", "/var/lib/gpuhost-agent")
    ), files
    calls = scenario.calls()
    assert "systemctl disable --now gpuhost-agent.service" in calls and "systemctl daemon-reload" in calls
    assert not [call for call in calls if call.startswith("docker")], "uninstall must not touch Docker"

    again = scenario.install("--uninstall")
    assert again.code == 0 and "is not installed here" in again.out

    purged = scenario.install("--uninstall", "--purge")
    assert purged.code == 0, purged.both
    assert_not_installed(scenario)


@needs_root
def test_pinned_install_on_a_gpu_less_chroot_and_the_unit_verifies_as_installed(scenario: Scenario) -> None:
    add(scenario, "docker")
    # Compose is missing and apt fails to install it: not fatal, the agent bundles one.
    scenario.sh(
        "echo docker-compose-plugin >/etc/fake/apt-candidates\n"
        "printf '#!/bin/sh\\nexit 1\\n' >/etc/fake/apt-hooks/docker-compose-plugin\n"
        "chmod +x /etc/fake/apt-hooks/docker-compose-plugin"
    )
    args = ("--url", URL, "--env-id", ENV_ID, "--api-key", KEY, "--allow-no-gpu")

    missing = scenario.install(*args, "--version", "9.9.9")
    assert missing.code == 1
    assert "pip could not install gpuhost-agent==9.9.9" in missing.err

    result = scenario.install(*args, "--version", __version__)
    assert result.code == 0, result.both
    assert f"source: gpuhost-agent=={__version__}" in result.out
    assert f"install.sh: warning: {allowed(msg('NVIDIA driver not found'))}\n" in result.err
    assert f"install.sh: warning: {msg('systemd is not running here')}\n" in result.err
    assert f"install.sh: warning: {msg('Docker Compose v2 is missing')}\n" in result.err
    assert "apt-get install -y -qq --no-install-recommends docker-compose-plugin" in scenario.calls()
    files = scenario.files("/etc/systemd/system/multi-user.target.wants/gpuhost-agent.service", INSTALLED[-1])
    assert files["/etc/systemd/system/multi-user.target.wants/gpuhost-agent.service"]["kind"] == "link"
    assert files[INSTALLED[-1]] is None, "Debian 12's systemd 252 has no RestartSteps="
    assert scenario.run("/opt/gpuhost-agent/venv/bin/gpuhost-agent", "version").out.strip() == __version__
    # The unit as installed, with its real ExecStart, by Debian 12's own systemd-analyze.
    verify = scenario.run("systemd-analyze", "verify", "/etc/systemd/system/gpuhost-agent.service")
    assert verify.code == 0 and not verify.both.strip(), verify.both


SWARM_KEY = "swarmkey_0123456789_do_not_print"


@needs_root
def test_a_swarm_worker_installs_with_the_environments_key_and_no_marketplace(scenario: Scenario) -> None:
    """The second machine of a Swarm environment (docs/swarm.md): no URL, id or
    API key; the environment's key in its own root-only file, never shown."""
    add(scenario, "docker", "compose", "nvidia", "toolkit")
    scenario.sh(f"printf '%s\\n' {SWARM_KEY} >/root/swarm.key; printf 'short\\n' >/root/short.key")
    for args, refusal in (
        (("--swarm", "worker"), "--swarm worker needs --swarm-key-file FILE"),
        (("--swarm", "boss", "--swarm-key-file", "/root/swarm.key"), "--swarm must be leader or worker"),
        (("--swarm", "worker", "--swarm-key-file", "/root/short.key"), "at least 16 printable characters"),
        (("--swarm", "leader", "--swarm-key-file", "/root/swarm.key"), "a first install needs --url"),
    ):
        refused = scenario.install(*args)
        assert refused.code == 2 and refusal in refused.err, (args, refused.both)
    assert_not_installed(scenario)

    result = scenario.install("--swarm", "worker", "--swarm-key-file", "/root/swarm.key")
    assert result.code == 0, result.both
    assert SWARM_KEY not in result.both and "cannot reach the marketplace" not in result.both
    files = scenario.files("/etc/gpuhost-agent/swarm-key", "/etc/gpuhost-agent/api-key")
    assert files["/etc/gpuhost-agent/swarm-key"]["mode"] == "0o600" and files["/etc/gpuhost-agent/api-key"] is None
    assert scenario.read("/etc/gpuhost-agent/swarm-key") == SWARM_KEY + "\n"
    assert conf_values(scenario.read("/etc/gpuhost-agent/agent.conf")) == {
        "GPUHOST_SWARM": "worker",
        "GPUHOST_SWARM_KEY_FILE": "/etc/gpuhost-agent/swarm-key",
        "GPUHOST_STATE_DIR": "/var/lib/gpuhost-agent",
    }
    loaded = scenario.run(
        "/opt/gpuhost-agent/venv/bin/python",
        "-c",
        "from gpuhost_agent.service import config; c = config.load({});"
        "print(c.swarm, c.swarm_key == open('/etc/gpuhost-agent/swarm-key').read().strip(), c.marketplace_url)",
    )
    assert loaded.out.split() == ["worker", "True", "None"], loaded.both
    holders = scenario.run("grep", "-rlF", SWARM_KEY, "/etc", "/opt", "/var", "/usr/local").out.split()
    assert holders == ["/etc/gpuhost-agent/swarm-key"], holders
    again = scenario.install()  # an upgrade in place keeps the role and the key
    assert again.code == 0 and SWARM_KEY not in again.both, again.both
    assert conf_values(scenario.read("/etc/gpuhost-agent/agent.conf"))["GPUHOST_SWARM"] == "worker"


# ---- the marketplace's line ----------------------------------------------------------------


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


async def _run_async(scenario: Scenario, command: str) -> Run:
    """scenario.run in a thread, so the test's marketplace keeps serving."""
    return await asyncio.to_thread(scenario.run, "bash", "-c", command)


@needs_root
async def test_the_marketplace_line_installs_the_agent_and_reports_init_state(scenario: Scenario) -> None:
    """The local marketplace's GET /environments/{envId}/script, pasted in the chroot:
    install.sh comes from GET /install.sh (no key), and its progress arrives as
    the environment's initState. NEEDS script_api wired into server.build_app."""
    store = Store.load_or_create(None)
    state = MarketplaceState(store)
    runner, base = await _serve(build_app(state))
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(
                f"{base}/environments/{store.envId}/script", headers={wire.API_KEY_HEADER: store.renterApiKey}
            ) as response:
                assert response.status == 200
                line = await response.json()
        assert line == (
            f"curl -fsSL {base}/install.sh | sudo bash -s -- --url {base} "
            f"--env-id {store.envId} --api-key {store.envApiKey}"
        )

        await asyncio.to_thread(add, scenario, "sudo", "curl")
        failed = await _run_async(scenario, line)  # no Docker, no NVIDIA here yet
        assert failed.code == 3, failed.both
        init = store.host["initState"]
        check_named(await asyncio.to_thread(load, AGENT_DOC), init, "InitState")  # the documented shape, no field more
        assert init["state"] == "failed" and init["error"].startswith("install: Docker Engine is not installed")
        assert [p["name"] for p in init["phases"]][:2] == ["install", "config"]

        await asyncio.to_thread(add, scenario, "docker", "compose", "nvidia", "toolkit")
        done = await _run_async(scenario, line)
        assert done.code == 0, done.both
        assert "source: gpuhost-agent)" in done.out  # from stdin: no checkout, so the package by name
        init = store.host["initState"]
        check_named(await asyncio.to_thread(load, AGENT_DOC), init, "InitState")
        install_phase = init["phases"][0]
        assert (init["state"], init["error"], install_phase["name"], install_phase["state"]) == (
            "starting",
            None,
            "install",
            "done",
        )
        assert wire.is_iso(install_phase["finishedAt"]) and wire.is_iso(init["updatedAt"])
        assert await asyncio.to_thread(scenario.read, "/etc/gpuhost-agent/api-key") == store.envApiKey + "\n"
        conf = conf_values(await asyncio.to_thread(scenario.read, "/etc/gpuhost-agent/agent.conf"))
        assert (conf["GPUHOST_MARKETPLACE_URL"], conf["GPUHOST_ENV_ID"]) == (base, store.envId)
        curls = [call for call in await asyncio.to_thread(scenario.calls) if call.startswith("curl ")]
        assert any("/agent/init-state" in call for call in curls)
        assert not [call for call in curls if store.envApiKey in call], "the key was on curl's command line"
        assert store.envApiKey not in done.both and store.envApiKey not in failed.both
    finally:
        await runner.cleanup()

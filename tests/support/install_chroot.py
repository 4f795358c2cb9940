"""The throw-away Debian 12 chroots install.sh is tested in (tests/integration/test_install*.py;
the fixtures rootfs, agent_wheels and scenario are in tests/integration/conftest.py).

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

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

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


def build_rootfs() -> Path:
    """The cached Debian 12 root file system, built on first use."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "rootfs-debian12.sh"), str(ROOTFS)], capture_output=True, text=True, timeout=900
    )
    assert built.returncode == 0, f"building the Debian 12 rootfs failed:\n{built.stdout}\n{built.stderr}"
    return ROOTFS


def build_agent_wheels(out: Path) -> Path:
    """The dependency wheelhouse (cached) and a wheel of the agent as it is now."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
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
FAKE_SUDO = '#!/bin/sh\necho "sudo $*" >>/var/log/fake-calls.log\nexec "$@"\n'
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


def make_scenario(rootfs: Path, agent_wheels: Path, tmp_path: Path) -> Scenario:
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
        f"install.sh systemd requirements | tar -C {CHECKOUT_IN_ROOT} -xf -\n",
        binds={"/stage": stage, "/checkout": ROOT},
    )
    return made


def drop_scenario(made: Scenario) -> None:
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
        "/etc/systemd/system/docker.service.d",
        "/usr/local/bin/gpuhost-agent",
    )
    assert all(value is None for value in found.values()), found


# ---- missing prerequisites ------------------------------------------------------------


def conf_values(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))

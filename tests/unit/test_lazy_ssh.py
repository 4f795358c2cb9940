"""asyncssh (about 15 MB of the agent's resting memory, bench/idle_cost.py),
`cryptography` (about 8 MB, for a Swarm's TLS) and the embedded marketplace
are loaded only when used, and docker-py with requests (7.5 MB) not at all
(the engine is spoken to over aiohttp: runtime/engine/calls.py): an agent built for a real marketplace has imported
none of them, on its first start (when it makes its host
key) as on later ones; the host key's public line and fingerprint, read
without asyncssh, are asyncssh's own."""

from __future__ import annotations

import subprocess
import sys

import asyncssh

from gpuhost_agent.streams.ssh import host_key as ssh_host_key

BUILD = """
import sys
from pathlib import Path
from gpuhost_agent.service import config
from gpuhost_agent.service.wiring import build_agent

state = Path(sys.argv[1])
loaded = config.load(
    {"marketplace_url": "http://127.0.0.1:9/v1", "env_id": "env-1", "api_key": "k", "state_dir": str(state)},
    environ={},
)
parts = build_agent(loaded, loaded.marketplace_url, "k")
print(parts.streams.session_info()["sshHostKeyFingerprint"])
print(sorted(name for name in sys.modules if name.split(".")[0] == "asyncssh")[:3])
print(sorted(name for name in sys.modules if ".local_marketplace" in name)[:3])
print(sorted(name for name in sys.modules if name.split(".")[0] == "cryptography")[:3])
print(sorted(name for name in sys.modules if name.split(".")[0] in ("docker", "requests", "urllib3"))[:3])
"""


def test_an_agent_built_for_a_real_marketplace_loads_neither_asyncssh_nor_the_local_marketplace(tmp_path) -> None:
    fingerprints = []
    for start in ("first", "second"):
        built = subprocess.run(
            [sys.executable, "-c", BUILD, str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
        )
        assert built.returncode == 0, built.stderr[-3000:]
        lines = built.stdout.strip().splitlines()[-5:]
        fingerprint, asyncssh_modules, marketplace_modules, tls_modules, docker_py_modules = lines
        assert asyncssh_modules == "[]", (start, asyncssh_modules)
        assert tls_modules == "[]", (start, "cryptography, for the Swarm's TLS alone", tls_modules)
        assert marketplace_modules == "[]", (start, marketplace_modules)
        assert docker_py_modules == "[]", (start, "docker-py is the tests' client, not the agent's", docker_py_modules)
        fingerprints.append(fingerprint)
    real = asyncssh.read_private_key(str(tmp_path / ssh_host_key.FILE_NAME))
    assert fingerprints == [real.get_fingerprint("sha256")] * 2  # made once, then kept
    assert (tmp_path / ssh_host_key.FILE_NAME).stat().st_mode & 0o777 == 0o600


def test_the_public_line_and_fingerprint_read_without_asyncssh_are_asyncssh_own(tmp_path) -> None:
    ssh_host_key.load_or_create(tmp_path)
    again = ssh_host_key.load_or_create(tmp_path)  # read back from the file, not from the key just made
    real = asyncssh.read_private_key(str(tmp_path / ssh_host_key.FILE_NAME))
    assert again.public_line == " ".join(real.export_public_key("openssh").decode().split()[:2])
    assert again.fingerprint == real.get_fingerprint("sha256")
    assert again.key.public_data == real.public_data == again.blob  # the key the SSH server will use


def test_a_damaged_key_file_is_an_error_not_a_new_key(tmp_path) -> None:
    path = tmp_path / ssh_host_key.FILE_NAME
    path.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaA==\n-----END OPENSSH PRIVATE KEY-----\n")
    try:
        ssh_host_key.load_or_create(tmp_path)
    except ssh_host_key.HostKeyUnreadable:
        pass
    else:
        raise AssertionError("a damaged key was taken")
    assert path.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaA==")  # left for the operator


LIGHT_COMMAND = """
import sys
from gpuhost_agent.service import cli
code = cli.main(sys.argv[1:])
print(sorted({name.split(".")[0] for name in sys.modules} & {"aiohttp", "docker", "structlog", "psutil", "yaml"}))
print("gpuhost_agent.service.daemon" in sys.modules)
raise SystemExit(code)
"""


def test_status_and_version_load_none_of_the_daemon(tmp_path) -> None:
    """`status` and `version` are what an operator types to look: they import
    the settings and the socket client, not the daemon's libraries (they took
    1.3 s when they did)."""
    for args in (["version"], ["status", "--state-dir", str(tmp_path)]):
        done = subprocess.run(
            [sys.executable, "-c", LIGHT_COMMAND, *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode in (0, 3), done.stderr[-3000:]
        assert done.stdout.strip().splitlines()[-2:] == ["[]", "False"], (args, done.stdout)


def test_probe_does_not_load_the_daemon(tmp_path) -> None:
    """`probe` reads the machine: the agent's own modules (its loop, jobs and
    streams) are not loaded for it (0.6 s of its 2.4)."""
    probe = ["probe", "--json", "--state-dir", str(tmp_path)]
    done = subprocess.run([sys.executable, "-c", LIGHT_COMMAND, *probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout[-2000:] + done.stderr[-2000:]

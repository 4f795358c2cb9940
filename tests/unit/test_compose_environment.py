"""No renter-chosen name or value becomes the environment of a host process.
The template's variables used to be Compose's process
environment, behind `setpriv` (a dynamically linked root process): a variable
`LD_PRELOAD` naming a library the renter had planted in a volume ran the
renter's code as root during `compose config`, before any policy check. Now
Compose runs with a fixed environment and reads the variables from a private
env file, as data for interpolation alone. Real Compose and real setpriv; no
Docker Engine (`config` asks it nothing)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.core.stacks.project_input import check_variables
from gpuhost_agent.runtime.compose import VARIABLES_FILE, ComposeRunner, find_compose_command, host_environment
from gpuhost_agent.runtime.host_process import HostProcesses

ALLOWED = {"PATH", "HOME", "DOCKER_CONFIG", "DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "GOGC"}
HOSTILE = {
    "LD_PRELOAD": "/var/lib/docker/volumes/p_v/_data/x.so",
    "LD_AUDIT": "/renter/audit.so",
    "LD_LIBRARY_PATH": "/renter/lib",
    "GCONV_PATH": "/renter/gconv",
    "PYTHONSTARTUP": "/renter/x.py",
    "BASH_ENV": "/renter/x.sh",
    "RENTER_SECRET": "s3cret-value-1234",
}
FILE = "services:\n  a:\n    image: x\n    environment:\n      GOT: ${V}\n"


def _workdir(tmp_path: Path, text: str = FILE) -> Path:
    workdir = tmp_path / "stack"
    workdir.mkdir(mode=0o700)
    (workdir / "compose.yaml").write_text(text)
    return workdir


def test_compose_runs_with_the_fixed_environment_whatever_the_variables(tmp_path: Path) -> None:
    """A stand-in Compose records the environment it was started with and the
    variables file it was given: only the allow-listed names, none of the
    renter's values, and the values in an owner-only file gone afterwards."""
    seen = tmp_path / "seen"
    fake = tmp_path / "compose"
    fake.write_text(
        "#!/bin/sh\n"
        f"tr '\\0' '\\n' < /proc/$$/environ > {seen}/environ\n"
        f"cp -p {VARIABLES_FILE} {seen}/variables\n"
        "echo '{\"services\": {}}'\n"
    )
    fake.chmod(0o755)
    seen.mkdir()
    workdir = _workdir(tmp_path)
    runner = ComposeRunner([str(fake)], tmp_path / "docker-config")

    asyncio.run(runner.config("p", workdir, "compose.yaml", {**HOSTILE, "V": "hello"}))

    environ = dict(line.split("=", 1) for line in (seen / "environ").read_text().splitlines() if "=" in line)
    assert set(environ) <= ALLOWED, set(environ) - ALLOWED
    assert environ["HOME"] == environ["DOCKER_CONFIG"] == str(tmp_path / "docker-config")
    assert not any(value in " ".join(environ.values()) for value in HOSTILE.values())
    given = seen / "variables"
    assert stat.S_IMODE(given.stat().st_mode) == 0o600
    assert 'RENTER_SECRET="s3cret-value-1234"' in given.read_text()
    assert not (workdir / VARIABLES_FILE).exists()  # only while `config` runs


def test_host_environment_holds_nothing_but_the_agents_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LD_PRELOAD", "/x.so")
    monkeypatch.setenv("GPUHOST_API_KEY", "agent-secret")
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/other.sock")
    env = host_environment(tmp_path)
    assert set(env) <= ALLOWED
    assert env["DOCKER_HOST"] == "unix:///run/other.sock"
    assert env["GOGC"] == "400"  # Go's collector sized for a short-lived CLI (runtime/host_process.py)
    assert "DOCKER_CONFIG" not in host_environment(None)


@pytest.mark.skipif(not shutil.which("gcc") or not shutil.which("setpriv"), reason="needs gcc and setpriv")
def test_a_loader_variable_loads_nothing_in_any_host_process(tmp_path: Path) -> None:
    """The finding as the audit made it: a library whose constructor writes a
    marker, named by LD_PRELOAD and LD_AUDIT. It ran in setpriv, as root,
    before the change (the test failed then); now nothing loads it and the
    interpolation still works."""
    marker = tmp_path / "ran-as-host"
    source = tmp_path / "evil.c"
    source.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void run(void) {\n"
        f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("owned", f); fclose(f); }}\n'
        "}\n"
        "unsigned int la_version(unsigned int v) { return v; }\n"
    )
    library = tmp_path / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    workdir = _workdir(tmp_path)
    runner = ComposeRunner(find_compose_command(), tmp_path / "docker-config")
    variables = {"LD_PRELOAD": str(library), "LD_AUDIT": str(library), "V": "hello"}

    model = asyncio.run(runner.config("p", workdir, "compose.yaml", variables))

    assert model["services"]["a"]["environment"]["GOT"] == "hello"
    assert not marker.exists(), "a renter's library ran in a host process"


NASTY = [
    "$HOME",
    "${HOME:-x}",
    "$$",
    "a'b",
    'a"b',
    "\\",
    "x\\",
    "\\'",
    '\\"',
    "\\n",
    "line\nbreak",
    "cr\rhere",
    'end"\nCOMPOSE_PROJECT_NAME=evil',
    "end'\nCOMPOSE_FILE=/etc/passwd",
    "#not a comment",
    " spaced ",
    "tab\there",
    "é✓\u2028\u2029\u0085",
    "".join(chr(c) for c in range(1, 32)),
    "`id`",
]


def test_every_value_reaches_compose_exactly_and_adds_no_variable(tmp_path: Path) -> None:
    """The env file is a format of its own (quotes, `$` expansion, escapes):
    each value comes back from the real Compose as written, and none can end
    its line and add a setting (COMPOSE_PROJECT_NAME, COMPOSE_FILE)."""
    lines = "".join(f"      V{i}: ${{V{i}}}\n" for i in range(len(NASTY)))
    workdir = _workdir(tmp_path, f"services:\n  a:\n    image: x\n    environment:\n{lines}")
    runner = ComposeRunner(find_compose_command(), tmp_path / "docker-config")
    variables = {f"V{i}": value for i, value in enumerate(NASTY)}

    model = asyncio.run(runner.config("p", workdir, "compose.yaml", variables))

    environment = model["services"]["a"]["environment"]
    got = {key: value.replace("$$", "$") for key, value in environment.items()}  # `config` escapes `$`
    wrong = {key: (value, got.get(key)) for key, value in variables.items() if got.get(key) != value}
    assert not wrong, json.dumps(wrong)
    assert model["name"] == "p"


@pytest.mark.parametrize("name", ["PATH\n", "HOME\n", "V\nLD_PRELOAD", "A B"])
def test_a_name_is_a_whole_name(name: str) -> None:
    """`$` in a regular expression also matches before a final newline: "PATH\\n"
    passed as a name and became a line of its own in the
    env file."""
    with pytest.raises(StackRejected, match="invalid"):
        check_variables({name: "x"})


async def test_a_host_process_inherits_no_descriptor_of_the_agent(tmp_path: Path) -> None:
    """A descriptor the agent holds without close-on-exec (a C library's: the
    NVIDIA driver's device files, opened by NVML) must not reach Compose, the
    docker CLI or setpriv: Python's own spawn closes every descriptor past
    stdio. uvloop was tried as the daemon's loop and dropped:
    libuv's spawn left such a descriptor, and copies of stdio, open in the
    child, and this test fails on it."""
    held, other_end = os.pipe()
    os.set_inheritable(held, True)
    try:
        process = await HostProcesses(tmp_path).start(["ls", "/proc/self/fd"])
        out, _ = await process.communicate()
    finally:
        os.close(held)
        os.close(other_end)
    open_in_child = {int(name) for name in out.split()}
    assert open_in_child <= {0, 1, 2, 3}, open_in_child  # stdio, and ls's own listing of the folder

"""The README's shell blocks, run in order as a reader pastes them, against `make run`.

A reader pastes the blocks into one terminal, one after the other, with the
agent and its local marketplace started by `make run` in another; so does this
test, in one bash process. Two rewrites only, both of what the reader is told
to change or cannot know: the renter key the banner printed replaces
`paste-the-renter-API-key`, and the port this test got replaces 8787 (a
developer's own `make run` may hold that one). The two set-up commands and the
install line (placeholders for a real marketplace) are the only blocks left out.

The blocks are not changed to stop at the first error, since a reader's shell
does not either: an ERR trap only writes down every command that failed, and
the test allows the failures the README itself announces.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from support.ssh_clients import free_port

from gpuhost_agent.protocol import wire

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)
NOT_PASTED_HERE = ("make run     #", "<base_url>/install.sh")  # the set-up commands; the install line
KEY_LINE = "KEY=paste-the-renter-API-key"
README_PORT = "127.0.0.1:8787"
# Failures the README announces: doctor on a machine with no GPU, the ssh
# example's `exit 3`, and the 5 s follow ended by curl's --max-time (28).
ANNOUNCED = (re.compile(r"gpuhost-agent doctor"), re.compile(r"^ssh .*exit 3"), re.compile(r"--max-time 5"))


def readme_script(key: str, port: int) -> str:
    blocks = [block for block in BLOCK.findall((ROOT / "README.md").read_text()) if not _left_out(block)]
    script = "\n".join(blocks)
    assert script.count(KEY_LINE) == 1 and README_PORT in script, "the README's curl session changed its set-up lines"
    script = script.replace(KEY_LINE, f"KEY={key}").replace(README_PORT, f"127.0.0.1:{port}")
    observer = "trap 'echo \"README-FAILED $? :: $BASH_COMMAND\" >&2' ERR\n"
    return observer + script + '\necho "README-RENTAL=$RENTAL"\n'


def _left_out(block: str) -> bool:
    return any(marker in block for marker in NOT_PASTED_HERE)


@pytest.fixture
def make_run(tmp_path):
    """`make run` as the README starts it, with its own state, port and key."""
    port, key = free_port(), "readme-" + secrets.token_hex(8)
    args = f"--state-dir {tmp_path / 'state'} --local-listen 127.0.0.1:{port} --local-api-key {key}"
    log = (tmp_path / "make-run.log").open("wb")
    agent = subprocess.Popen(
        ["make", "--no-print-directory", "run", f"ARGS={args}"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _until_serving(port, key, agent, tmp_path / "make-run.log")
        yield port, key
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(timeout=60)
        log.close()


def _until_serving(port: int, key: str, agent: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 180  # the set-up's first run on a machine builds images
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/environments", headers={wire.API_KEY_HEADER: key})
    while time.monotonic() < deadline:
        assert agent.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200 and response.read() != b"[]":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError("make run never served the local marketplace:\n" + log.read_text())


def test_readme_shell_blocks_work_as_pasted(make_run, tmp_path, docker_client):
    port, key = make_run
    started = int(time.time())
    script = tmp_path / "readme.sh"  # a file, not stdin: ssh would read the rest of the blocks as its input
    script.write_text(readme_script(key, port))
    done = subprocess.run(
        ["bash", str(script)],
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    out, err = done.stdout, done.stderr
    report = f"--- stdout\n{out}\n--- stderr\n{err}"

    failed = [line.split(" :: ", 1)[1] for line in err.splitlines() if line.startswith("README-FAILED ")]
    unannounced = [command for command in failed if not any(p.search(command) for p in ANNOUNCED)]
    assert unannounced == [], report
    assert "Traceback" not in out + err, report

    assert out.count("hello from a rental") >= 2, report  # through the published port and through the tunnel
    assert "APPLIED\n" in out and "exit status 3" in out and "a file from the renter" in out, report
    served = re.findall(r"^(?:\S+Z )?serving on port 8080$", out, re.MULTILINE)  # tail (timestamps), then follow
    assert len(served) == 2 and "response:200" in err, report
    assert "40 120" in out, report  # the terminal's `stty size`
    assert out.count("a notebook on the loopback") == 2 and "logged in to " in out, report  # ssh -L and -D to localhost
    # The shell's questions to its terminal stay out of the reader's (a stray `;5R` on their next prompt),
    # and the terminal's end is a line of its own.
    assert not re.search(r"\x1b\[[0-9;?>]*[cn]", out), report
    assert '{"type": "end", "reason": "exited", "exitCode": 0}\n' in out, report
    assert "gone\n" in out and "COMPLETE\n" in out and '"timezone": "Europe/Berlin"' in out, report

    (rental,) = re.findall(r"^README-RENTAL=(\S+)$", out, re.MULTILINE)
    rental_label = f"{wire.LABEL_RENTAL}={rental}"
    deadline = time.monotonic() + 60
    while docker_client.containers.list(all=True, filters={"label": rental_label}):
        assert time.monotonic() < deadline, "the ended rental's containers are still there"
        time.sleep(0.5)
    # Both examples stop on SIGTERM (143), not on the SIGKILL after their stop timeout (137).
    died = subprocess.run(
        ["docker", "events", "--since", str(started), "--until", str(int(time.time()) + 1)]
        + ["--filter", f"label={rental_label}", "--filter", "event=die"]
        + ["--format", "{{.Actor.Attributes.name}} {{.Actor.Attributes.exitCode}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split("\n")
    exits = sorted(line.split()[-1] for line in died if line)
    assert exits == ["143", "143"], died

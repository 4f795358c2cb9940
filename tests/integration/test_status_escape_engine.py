"""`gpuhost-agent status`, the real command, on a host whose stacks carry a
hostile renter's text: a stack name and a deploy error
holding an OSC 52 clipboard write, a carriage return, line feeds that would
forge a line, C1 controls and bidi overrides. None of them reaches the
operator's terminal raw; each is shown as its escape."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.stacks import TEST_IMAGE

from gpuhost_agent.protocol import wire
from gpuhost_agent.service.wiring import start_status_server

CLIPBOARD = "\x1b]52;c;cm0gLXJmIC8K\x07"  # OSC 52: put "rm -rf /" in the operator's clipboard
HOSTILE = f"ok{CLIPBOARD}\r[FAKE] agent healthy\n  fake-stack \u202egnp.exe\x9b31m\x85\u2028\x7f"
# A label in the agent's namespace is refused, and the refusal names it: the text reaches errorMsg
FAILING = f"""
services:
  app:
    image: {TEST_IMAGE}
    command: ["sleep", "1000"]
    labels: {{{json.dumps("io.gpuhost." + HOSTILE)}: "x"}}
"""
SLEEPER = f"""
services:
  app:
    image: {TEST_IMAGE}
    command: ["sleep", "100000"]
    stop_grace_period: 1s
"""
ACTING = [chr(c) for c in range(0x20) if c != 0x0A] + ["\x7f", *map(chr, range(0x80, 0xA0))]
ACTING += ["\u2028", "\u2029", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))]


@pytest.fixture
def socket_dir():
    path = Path(tempfile.mkdtemp(prefix="gh-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _status(sock: Path, *flags: str) -> bytes:
    command = [str(Path(sys.executable).with_name("gpuhost-agent")), "status", "--socket", str(sock), *flags]
    done = subprocess.run(command, capture_output=True, timeout=30)
    assert done.returncode == 0, done
    return done.stdout


async def test_status_shows_renter_text_escaped(local_market, socket_dir):
    renter, parts, _local = local_market
    rental_id = await renter.rental()
    named = await renter.stack(rental_id, SLEEPER, name=HOSTILE)
    failing = await renter.stack(rental_id, FAILING, name="failing")
    for stack_id in (named, failing):
        await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    sock = socket_dir / "agent.sock"
    server = await start_status_server(parts, sock)
    try:
        raw = await asyncio.to_thread(_status, sock, "--json")
        status = json.loads(raw)
        stacks = {s["stackId"]: s for s in status["stacks"]}
        assert stacks[named]["name"] == HOSTILE  # the agent holds the text as the renter sent it
        error = stacks[failing]["errorMsg"]
        assert CLIPBOARD in error, error  # and the deploy's error quotes it
        assert not set(raw.decode()) & set(ACTING) - {"\n"}  # --json escapes them all

        text = (await asyncio.to_thread(_status, sock)).decode()
    finally:
        await server.stop()
    shown = [c for c in ACTING if c in text]
    assert not shown, (shown, text)
    assert "ok\\x1b]52;c;cm0gLXJmIC8K\\x07\\x0d[FAKE] agent healthy\\x0a  fake-stack \\u202egnp.exe\\x9b31m" in text
    assert not [line for line in text.splitlines() if line.startswith(("[FAKE]", "  fake-stack"))]
    assert "\\x1b]52;c;cm0gLXJmIC8K\\x07" in text.split(f"  {failing} ")[1]  # the error, shown escaped

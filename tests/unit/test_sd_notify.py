"""sd_notify: a Unix datagram socket stands in for systemd ($NOTIFY_SOCKET) and
must receive READY=1, STOPPING=1, STATUS= and WATCHDOG=1, from the module and
from a real `gpuhost-agent run` process; a blocked event loop must stop the
watchdog pings (that is how systemd notices a hung agent).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from gpuhost_agent.service import sd_notify


class FakeSystemd:
    """A bound datagram socket, collecting (arrival time, message) in a thread."""

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.05)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, OSError):
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def texts(self) -> list[str]:
        return [text for _, text in self.messages]

    def wait_for(self, predicate, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(predicate(text) for text in self.texts()):
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture(autouse=True)
def fresh_module_state(monkeypatch):
    """READY/STOPPING are process-wide in the module; each test starts clean."""
    monkeypatch.setattr(sd_notify, "_ready_sent", False)
    monkeypatch.setattr(sd_notify, "_stopping_sent", False)
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def systemd(tmp_path, monkeypatch):
    path = tmp_path / "notify.sock"
    fake = FakeSystemd(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield fake
    fake.close()


def test_without_notify_socket_every_call_is_a_no_op() -> None:
    assert sd_notify.notify("READY=1") is False
    assert sd_notify.ready() is False
    assert sd_notify.watchdog_ping() is False
    assert sd_notify.Watchdog(interval=0.01).start() is None


def test_messages_reach_a_path_socket(systemd: FakeSystemd) -> None:
    assert sd_notify.ready("connected to\nhttp://m/v1")
    assert sd_notify.status("3 stacks")
    assert sd_notify.watchdog_ping()
    assert sd_notify.stopping()
    assert systemd.wait_for(lambda text: text == "STOPPING=1")
    assert systemd.texts() == [
        "READY=1\nSTATUS=connected to http://m/v1",
        "STATUS=3 stacks",
        "WATCHDOG=1",
        "STOPPING=1",
    ]
    assert sd_notify.is_ready()


def test_messages_reach_an_abstract_socket(monkeypatch) -> None:
    name = f"gpuhost-test-{uuid.uuid4().hex}"
    fake = FakeSystemd("\0" + name)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sd_notify.ready()
        assert fake.wait_for(lambda text: text == "READY=1")
    finally:
        fake.close()


def test_a_socket_nobody_listens_on_is_not_an_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert sd_notify.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")  # a kind this module does not speak
    assert sd_notify.ready() is False


def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process_only(monkeypatch) -> None:
    assert sd_notify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert sd_notify.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sd_notify.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # inherited by a child: not ours
    assert sd_notify.watchdog_interval() is None
    monkeypatch.delenv("WATCHDOG_PID")
    for bad in ("", "0", "soon"):
        monkeypatch.setenv("WATCHDOG_USEC", bad)
        assert sd_notify.watchdog_interval() is None


async def test_watchdog_pings_from_the_loop_and_extends_the_start_until_ready(
    systemd: FakeSystemd, monkeypatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # pings every 50 ms
    watchdog = sd_notify.Watchdog()
    assert watchdog.interval == 0.05
    assert watchdog.start() is not None
    await asyncio.sleep(0.18)
    sd_notify.ready()
    await asyncio.sleep(0.18)
    await watchdog.stop()
    texts = systemd.texts()
    before = texts[: texts.index("READY=1")]
    after = texts[texts.index("READY=1") + 1 :]
    assert len(before) >= 2 and all(t == "WATCHDOG=1\nEXTEND_TIMEOUT_USEC=100000" for t in before), texts
    assert len(after) >= 2 and all(t == "WATCHDOG=1" for t in after), texts


async def test_a_blocked_event_loop_stops_the_pings(systemd: FakeSystemd) -> None:
    """A hung loop must look hung to systemd: no thread keeps pinging for it."""
    watchdog = sd_notify.Watchdog(interval=0.02)
    watchdog.start()
    await asyncio.sleep(0.1)
    blocked_from = time.monotonic()
    time.sleep(0.5)  # noqa: ASYNC251 - the loop is stuck, on purpose
    blocked_until = time.monotonic()
    await asyncio.sleep(0.1)
    await watchdog.stop()
    during = [t for t, _ in systemd.messages if blocked_from + 0.05 < t < blocked_until - 0.01]
    after = [t for t, _ in systemd.messages if t > blocked_until]
    assert during == [], "pings arrived while the event loop was blocked"
    assert after, "pings did not resume once the loop ran again"


async def test_no_extend_timeout_once_stopping(systemd: FakeSystemd) -> None:
    sd_notify.stopping()
    watchdog = sd_notify.Watchdog(interval=0.02)
    watchdog.start()
    await asyncio.sleep(0.1)
    await watchdog.stop()
    assert systemd.texts()[0] == "STOPPING=1"
    assert set(systemd.texts()[1:]) == {"WATCHDOG=1"}


async def test_notify_ready_when_waits_for_the_event(systemd: FakeSystemd) -> None:
    connected = asyncio.Event()
    task = asyncio.create_task(sd_notify.notify_ready_when(connected, "connected"))
    await asyncio.sleep(0.05)
    assert systemd.texts() == []
    connected.set()
    await asyncio.wait_for(task, 2)
    assert await asyncio.to_thread(systemd.wait_for, lambda text: text == "READY=1\nSTATUS=connected")


def test_real_agent_process_notifies_systemd(tmp_path: Path) -> None:
    """A real `gpuhost-agent run` (local marketplace) under a stand-in systemd:
    READY=1 once connected, WATCHDOG=1 every WATCHDOG_USEC/2, STOPPING=1 on SIGTERM.

    NEEDS THE daemon.py WIRING of sd_notify (Watchdog started in serve(),
    READY when parts.session.connected is set, STOPPING on the way out); it fails
    until that is in.
    """
    notify_path = tmp_path / "notify.sock"
    fake = FakeSystemd(str(notify_path))
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUHOST_")}
    env.update(NOTIFY_SOCKET=str(notify_path), WATCHDOG_USEC="1000000", GPUHOST_CONFIG=str(tmp_path / "none.conf"))
    (tmp_path / "none.conf").write_text("# empty: no marketplace, the local one\n")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuhost_agent",
            "run",
            "--state-dir",
            str(tmp_path / "state"),
            "--local-listen",
            "127.0.0.1:0",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        ready = fake.wait_for(lambda text: text.startswith("READY=1"), timeout=30)
        pings_after_ready = fake.wait_for(
            lambda text: text == "WATCHDOG=1" and "READY=1" in "".join(fake.texts()), timeout=5
        )
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
        stopping = fake.wait_for(lambda text: text.startswith("STOPPING=1"), timeout=2)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        fake.close()
    stderr = process.stderr.read().decode(errors="replace")[-3000:] if process.stderr else ""
    assert ready, f"no READY=1 from the agent (messages: {fake.texts()}); stderr:\n{stderr}"
    assert pings_after_ready, f"no WATCHDOG=1 after READY (messages: {fake.texts()})"
    assert stopping, f"no STOPPING=1 after SIGTERM (messages: {fake.texts()})"
    assert code == 0, stderr

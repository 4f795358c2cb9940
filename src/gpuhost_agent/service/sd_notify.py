"""Tell systemd how the agent is doing (sd_notify(3)), in plain Python.

The unit is Type=notify with WatchdogSec=: systemd counts the agent as started
when it says READY=1, and restarts it when WATCHDOG=1 stops coming. The
protocol is one datagram per message to the Unix socket named by
$NOTIFY_SOCKET (a path, or '@name' for the abstract namespace), so no
libsystemd binding is needed. With no $NOTIFY_SOCKET (not under systemd, or in
tests) every call is a no-op, and a failed send is never an error for the
agent: systemd's view of it must not be what stops it.

The watchdog pings come from a task on the agent's event loop, not a thread:
what systemd must notice is a loop that no longer runs, and a thread would
keep pinging for a loop that hangs. Before READY the same task also sends
EXTEND_TIMEOUT_USEC, so a start that waits long for the marketplace is not
killed by TimeoutStartSec= as long as the loop is alive.
"""

from __future__ import annotations

import asyncio
import os
import socket

from gpuhost_agent.common.logs import get_logger

log = get_logger(__name__)

# Process-wide, as systemd's view of the process is.
_ready_sent = False
_stopping_sent = False


def _address() -> str | None:
    path = os.environ.get("NOTIFY_SOCKET", "")
    if path.startswith("@"):
        return "\0" + path[1:]  # abstract socket
    if path.startswith("/"):
        return path
    return None  # unset, or a kind (vsock:...) this module does not speak


def notify(message: str) -> bool:
    """Send one message (lines of KEY=VALUE); True if it was handed to the socket."""
    address = _address()
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.setblocking(False)  # never stall the event loop on a full queue
            sock.connect(address)
            sock.send(message.encode())
        return True
    except OSError as exc:
        log.warning("sd_notify_failed", message=message.split("\n", 1)[0], error=str(exc))
        return False


def _one_line(text: str) -> str:
    return " ".join(text.split())


def ready(status_text: str | None = None) -> bool:
    """The agent is up: connected to the marketplace, or serving local work."""
    global _ready_sent
    _ready_sent = True
    message = "READY=1"
    if status_text:
        message += f"\nSTATUS={_one_line(status_text)}"
    return notify(message)


def is_ready() -> bool:
    return _ready_sent


def stopping(status_text: str | None = None) -> bool:
    """Shutting down (SIGTERM): systemd then waits up to TimeoutStopSec=."""
    global _stopping_sent
    _stopping_sent = True
    message = "STOPPING=1"
    if status_text:
        message += f"\nSTATUS={_one_line(status_text)}"
    return notify(message)


def status(text: str) -> bool:
    """A one-line state for `systemctl status`."""
    return notify(f"STATUS={_one_line(text)}")


def watchdog_ping() -> bool:
    return notify("WATCHDOG=1")


def watchdog_interval() -> float | None:
    """Seconds between pings, half of $WATCHDOG_USEC as sd_watchdog_enabled(3)
    advises; None when no watchdog is asked for this process (a child that
    inherited the variables has another pid than $WATCHDOG_PID)."""
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec / 1_000_000 / 2


async def notify_ready_when(event: asyncio.Event, status_text: str | None = None) -> None:
    """Send READY=1 once event is set (e.g. the agent's `connected`)."""
    await event.wait()
    ready(status_text)


class Watchdog:
    """Pings systemd's watchdog from the event loop, at half of $WATCHDOG_USEC.

    start() returns None (and does nothing) when systemd asked for no watchdog.
    """

    def __init__(self, interval: float | None = None):
        self.interval = interval if interval is not None else watchdog_interval()
        self._task: asyncio.Task | None = None

    def start(self) -> asyncio.Task | None:
        if self.interval is None or _address() is None:
            return None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sd-watchdog")
        return self._task

    async def _run(self) -> None:
        assert self.interval is not None
        # Until READY, also push the start timeout out by two intervals each
        # time (never once stopping: the stop timeout must stay as it is).
        extend_usec = int(self.interval * 2 * 1_000_000)
        while True:
            if _ready_sent or _stopping_sent:
                watchdog_ping()
            else:
                notify(f"WATCHDOG=1\nEXTEND_TIMEOUT_USEC={extend_usec}")
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

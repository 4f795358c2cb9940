"""The first thing `gpuhost-agent run` does under systemd: become the version
the upgrade record chooses (core/upgrade_plan.py's start_choice).

The unit's ExecStart is always the installed agent (install.sh's, under
/opt/gpuhost-agent), so the code that decides what runs, and that rolls a
failed trial back, is the version the host installed and trusted, never the
one on trial. It execs the chosen version in place (same PID: systemd's
notify socket and watchdog follow it). For a version on trial it first leaves
a guardian: a small process of the installed version, in the unit's cgroup,
that waits for the trial's bound and, if the trial is still not confirmed,
writes why and stops the agent (SIGTERM); systemd starts the unit again and
this launcher rolls back. When the agent exits for any reason, systemd kills
the guardian with the rest of the unit.

Only the standard library, the record's module and the wire's clock are loaded before the exec.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

from gpuhost_agent.core import upgrade_plan
from gpuhost_agent.protocol import wire_time
from gpuhost_agent.storage import upgrade_state

LAUNCHED = "GPUHOST_LAUNCHED_FROM"  # service/upgrades.py reads it: the installed agent's prefix


def launch(state_dir: Path, argv: list[str]) -> None:
    """Return to run this process's agent, or exec the chosen version's."""
    if os.environ.get(LAUNCHED) or not os.environ.get("NOTIFY_SOCKET"):
        return  # already launched, or not under systemd (no restarts: no upgrades)
    with upgrade_state.locked(state_dir):
        record = upgrade_state.load(state_dir)
        choice = upgrade_plan.start_choice(record, wire_time.iso())
        if choice.prefix is not None and not _agent(choice.prefix).is_file():
            choice = upgrade_plan.Start(None, {**choice.record, "current": None, "trial": None},
                                        said=f"{choice.prefix} is gone: the installed version runs")  # fmt: skip
        if choice.record != record:
            upgrade_state.save(state_dir, choice.record)
        rolled_back = record["trial"]["prefix"] if record["trial"] and choice.record["trial"] is None else None
    if rolled_back and Path(rolled_back).parent == state_dir / upgrade_state.VERSIONS:
        shutil.rmtree(rolled_back, ignore_errors=True)  # never started again: the same build is not retried
    if choice.said:
        print(f"gpuhost-agent launcher: {choice.said}", file=sys.stderr, flush=True)
    if choice.prefix is None or Path(choice.prefix) == Path(sys.prefix):
        return
    if choice.guard_seconds is not None:
        _leave_guardian(state_dir, choice.prefix, choice.guard_seconds, os.getpid())
    env = {**os.environ, LAUNCHED: sys.prefix}
    os.execve(_agent(choice.prefix), [str(_agent(choice.prefix)), *argv], env)


def _agent(prefix: str) -> Path:
    return Path(prefix) / "bin" / "gpuhost-agent"


def _leave_guardian(state_dir: Path, prefix: str, seconds: float, agent_pid: int) -> None:
    """A grandchild (so that the agent never has to reap it) that outlives the exec."""
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    try:
        if os.fork():
            os._exit(0)
        os.setsid()
        _guard(state_dir, prefix, seconds, agent_pid)
    finally:
        os._exit(0)


def _guard(state_dir: Path, prefix: str, seconds: float, agent_pid: int) -> None:
    time.sleep(seconds)
    why = f"it did not pass its health check (session opened, engine ready, reconcile done) within {seconds:g} s"
    with upgrade_state.locked(state_dir):
        expired = upgrade_plan.expired(upgrade_state.load(state_dir), prefix, why)
        if expired is None:
            return  # confirmed: nothing to guard
        upgrade_state.save(state_dir, expired)
    print(f"gpuhost-agent launcher: the version at {prefix} {why}: stopping it", file=sys.stderr, flush=True)
    try:
        os.kill(agent_pid, signal.SIGTERM)
    except ProcessLookupError:
        pass

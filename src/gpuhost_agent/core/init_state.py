"""Environment.initState: the phases from first start to ready, as they happen.

A host who just ran the install script watches this on the marketplace: which
phase the agent is in, and if it is stuck, the exact reason (Docker not
running, Compose missing...). A failed phase is retried, so the state moves on
by itself once the host fixes the cause.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuhost_agent.protocol import wire_time

PHASES = ("config", "marketplace", "docker", "compose", "hardware", "compliance")
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
STARTING, READY = "starting", "ready"


class InitState:
    def __init__(self, on_change: Callable[[dict[str, object]], None] | None = None):
        self._on_change = on_change or (lambda body: None)
        self.phases = {
            name: {"name": name, "state": PENDING, "startedAt": None, "finishedAt": None, "detail": None}
            for name in PHASES
        }
        self.state = STARTING
        self.current: str | None = None
        self.error: str | None = None

    def begin(self, phase: str, detail: str | None = None) -> None:
        entry = self.phases[phase]
        if entry["state"] != RUNNING or entry["detail"] != detail:
            entry.update(state=RUNNING, detail=detail, finishedAt=None)
            entry["startedAt"] = entry["startedAt"] or wire_time.iso()
            self.current = phase
            self._emit()

    def done(self, phase: str, detail: str | None = None) -> None:
        self.phases[phase].update(state=DONE, finishedAt=wire_time.iso(), detail=detail)
        if self.current == phase and self.error is not None:
            self.error = None
        self._emit()

    def failed(self, phase: str, error: str) -> None:
        """The phase could not finish; it will be tried again."""
        entry = self.phases[phase]
        if entry["state"] == FAILED and self.error == error:
            return  # same failure again: nothing new to tell
        entry.update(state=FAILED, detail=error, finishedAt=None)
        entry["startedAt"] = entry["startedAt"] or wire_time.iso()
        self.current, self.error = phase, f"{phase}: {error}"
        self._emit()

    def ready(self) -> None:
        self.state, self.current, self.error = READY, None, None
        self._emit()

    def as_wire(self) -> dict[str, object]:
        failed = any(entry["state"] == FAILED for entry in self.phases.values())
        return {
            "state": "failed" if failed and self.state != READY else self.state,
            "phase": self.current,
            "error": self.error,
            "phases": [dict(entry) for entry in self.phases.values()],
            "updatedAt": wire_time.iso(),
        }

    def _emit(self) -> None:
        self._on_change(self.as_wire())

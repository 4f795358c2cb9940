"""Per-key coalescing windows, as a pure state machine (the caller keeps the clock).

A burst of engine events on one stack must give a handful of container-list
pushes, not one per event. The first event for a key opens a window; when it
closes the caller flushes the key once. Events that arrive while that flush
runs are not lost: they mark the key dirty, and the end of the flush opens the
next window. So a stack is flushed at most once per window plus flush time,
however many events it gets, and its last event is always followed by a flush.
"""

from __future__ import annotations

WAITING, FLUSHING, DIRTY = "waiting", "flushing", "dirty"


class Coalescer:
    def __init__(self) -> None:
        self._state: dict[str, str] = {}

    def event(self, key: str) -> bool:
        """Note an event; True when it opens a window (the caller schedules the flush)."""
        state = self._state.get(key)
        if state is None:
            self._state[key] = WAITING
            return True
        if state == FLUSHING:
            self._state[key] = DIRTY
        return False

    def begin(self, key: str) -> None:
        """The window closed: the flush starts."""
        self._state[key] = FLUSHING

    def end(self, key: str, again: bool = False) -> bool:
        """The flush is over; True when another window must open at once:
        events came during the flush, or the caller wants to look again
        (`again`, e.g. the stack was busy with a job)."""
        dirty = self._state.pop(key, None) == DIRTY or again
        if dirty:
            self._state[key] = WAITING
        return dirty

    def pending(self) -> set[str]:
        return set(self._state)

    def clear(self) -> None:
        self._state.clear()

"""The agent's errors: one root, and three families that callers catch by.

- Refusal: refused by a rule; the asker's to change (a renter's file or
  request, a setting, a peer's message).
- OutsideFailure: something outside the agent failed or answered wrong (the
  engine, Compose, the kernel, the marketplace, a file).
- Stopped: the agent stopped the work itself (cancelled, or past its time).

Each error keeps its builtin base beside its family (ValueError, OSError...),
so what caught it before still does.
"""

from __future__ import annotations


class AgentError(Exception):
    """Every error the agent raises of its own."""


class Refusal(AgentError):
    """Refused by a rule: the asker's to change."""


class OutsideFailure(AgentError):
    """Something outside the agent failed or answered wrong."""


class Stopped(AgentError):
    """The agent stopped the work itself: cancelled, or past its time."""

"""The marketplace's replies to a session's opening and to a heartbeat.

docs/agent-api.yaml's Session and HeartbeatReply, as uplink/client.py hands
them on: the very objects decoded from JSON, not checked. So every value
the agent validates before use (a time, the intervals, the requirements, a
release offer) is typed `object`, and its reader checks it
(protocol/wire_time.py, intervals.py, requirements.py, wire_release.py) as
before; the two ids are typed as the spec gives them and still checked
where they are used. Every key may be missing.
"""

from __future__ import annotations

from typing import TypedDict


class OfferingReply(TypedDict, total=False):
    """What both replies may carry: a release offered to the agent (wire_release.decode_offer)."""

    agentRelease: object


class SessionReply(OfferingReply, total=False):
    """The reply to `POST /agent/sessions`."""

    sessionId: str  # sent back as X-Agent-Session
    envId: str  # checked (wire_values.is_safe_id) before it is used
    serverTime: object
    requeuedJobs: object
    intervals: object
    requirements: object


class HeartbeatReply(OfferingReply, total=False):
    """The reply to `POST /agent/heartbeat`."""

    serverTime: object
    heartbeatIntervalSeconds: object
    systemDataWanted: object

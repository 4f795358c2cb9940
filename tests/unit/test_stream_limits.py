"""The agent's stream caps (streams/limits.py), as streams/admission.py
refuses past them: logs and terminals apart from tunnel and SSH connections,
each capped for the agent and for one rental."""

from __future__ import annotations

from gpuhost_agent.streams.admission import over_caps
from gpuhost_agent.streams.limits import StreamLimits
from gpuhost_agent.streams.requests import LogsRequest, SshRequest, TerminalRequest, TunnelRequest

LIMITS = StreamLimits(streams=3, streams_per_rental=2, connections=4, connections_per_rental=3)


def _logs(rental: str, n: int) -> LogsRequest:
    return LogsRequest(f"l-{rental}-{n}", rental, "s", "c")


def _tunnel(rental: str, n: int) -> TunnelRequest:
    return TunnelRequest(f"t-{rental}-{n}", rental, "s", "c", 8080)


def test_one_rental_cannot_take_what_another_needs() -> None:
    open_now = [_logs("a", 1), _logs("a", 2)]
    refused = over_caps(_logs("a", 3), open_now, LIMITS)
    assert refused is not None and refused.status == 429 and "this rental has 2" in refused.error
    assert over_caps(TerminalRequest("t", "b", "s", "c"), open_now, LIMITS) is None  # another renter's terminal
    open_now.append(_logs("b", 1))
    refused = over_caps(_logs("c", 1), open_now, LIMITS)
    assert refused is not None and refused.status == 503
    assert "too many open log streams and terminals on this host (3)" in refused.error


def test_connections_are_counted_apart_from_streams() -> None:
    full_of_streams = [_logs("a", 1), _logs("a", 2), _logs("b", 1)]
    assert over_caps(_tunnel("a", 1), full_of_streams, LIMITS) is None  # a tunnel still opens
    connections = [_tunnel("a", n) for n in range(3)]
    refused = over_caps(SshRequest("ssh-a", "a", ("s",)), connections, LIMITS)  # SSH counts with tunnels
    assert refused is not None and "this rental has 3 open tunnel and SSH connections" in refused.error
    assert over_caps(_logs("a", 1), connections, LIMITS) is None  # and the renter's logs still open
    refused = over_caps(_tunnel("c", 1), [*connections, _tunnel("b", 1)], LIMITS)
    assert refused is not None and "(4)" in refused.error

"""The agent's stream caps (streams/limits.py), as streams/admission.py
refuses past them: logs and terminals apart from tunnel and SSH connections,
each capped for the agent and for one rental."""

from __future__ import annotations

from gpuhost_agent.streams.admission import over_caps, pre_login_to_drop
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


def test_a_rental_that_holds_none_always_finds_room() -> None:
    """Rentals that each open all they may (one renter's or several)
    leave a newcomer half of what is free: with the default caps, ten greedy
    rentals never fill the host, and each got its first connection."""
    caps = StreamLimits()
    open_now: list = []
    for rental in (f"r{n}" for n in range(10)):
        assert over_caps(_tunnel(rental, 0), open_now, caps) is None, rental
        while over_caps(request := _tunnel(rental, len(open_now)), open_now, caps) is None:
            open_now.append(request)
        refused = over_caps(_tunnel(rental, -1), open_now, caps)
        assert refused is not None and refused.status == 429, rental
    assert len(open_now) < caps.connections
    assert sum(1 for r in open_now if r.rental_id == "r0") == caps.connections_per_rental
    assert sum(1 for r in open_now if r.rental_id == "r2") == (caps.connections - 2 * 512 + 1) // 2


def test_ssh_connections_not_logged_in_take_a_few_places_of_their_own() -> None:
    """SSH connections that have not logged in count on the host's cap
    only; past `ssh_logins_per_rental` of them the oldest is closed for the
    newest, never a logged-in one; a logged-in one counts on the rental's cap."""
    caps = StreamLimits(connections=100, connections_per_rental=10, ssh_logins_per_rental=3)
    logged_in = SshRequest("in", "a", ("s",))
    logged_in.login.logged_in = True
    waiting = [SshRequest(f"w{n}", "a", ("s",)) for n in range(3)]
    open_now = [logged_in, *waiting, *[_tunnel("a", n) for n in range(8)]]
    assert over_caps(_tunnel("a", 9), open_now, caps) is None  # 9 of 10: the waiting ones are not counted
    assert pre_login_to_drop(_tunnel("a", 9), open_now, caps) is None
    assert pre_login_to_drop(SshRequest("new", "b", ("s",)), open_now, caps) is None  # another rental's places
    assert pre_login_to_drop(SshRequest("new", "a", ("s",)), open_now, caps) is waiting[0]
    waiting[0].login.dropped = True
    assert pre_login_to_drop(SshRequest("new", "a", ("s",)), open_now, caps) is None
    open_now.append(_tunnel("a", 9))
    refused = over_caps(SshRequest("new", "a", ("s",)), open_now, caps)  # no login past the rental's cap
    assert refused is not None and refused.status == 429
    refused = over_caps(_tunnel("b", 0), [*open_now, *[SshRequest(f"x{n}", "a", ("s",)) for n in range(88)]], caps)
    assert refused is not None and refused.status == 503  # the host's cap counts them all

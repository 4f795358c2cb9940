"""How many streams the agent holds open at once, and for one rental (pure).

Two kinds, capped apart because they cost differently. Logs and terminals
hold up to 1 MiB of log buffer each and are few; tunnel and SSH connections
hold at most 64 KiB per direction and come by the hundred (a web UI opens
many connections, a renter may hold a thousand). Each kind has a cap for the
agent, which bounds its memory whatever the clients do, and a lower one for
one rental, so one renter's connections can never leave another renter
without a terminal or a tunnel. The refusal past a cap (429 for the rental's,
503 for the host's) is streams/admission.py's, with every other refusal of a
stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost_agent.streams.requests import SshRequest, StreamRequest, TunnelRequest


@dataclass(frozen=True)
class StreamLimits:
    streams: int = 64  # logs and terminals, the whole agent
    streams_per_rental: int = 32
    # Tunnel and SSH connections, the whole agent: about 100 KiB each held
    # (bench/tunnel.py --hold, both ends of the relay), so 2048 stay near 200 MiB.
    connections: int = 2048
    # A quarter of the host's, and never more than half of what the other
    # rentals leave free (streams/admission.py): two rentals of one renter
    # cannot take the host, and a rental that holds none always finds room.
    connections_per_rental: int = 512
    # SSH connections of one rental not logged in yet, apart from its cap: a
    # stranger who holds idle connections to the rental's public endpoint
    # takes these few, never the renter's tunnels or logged-in sessions; past
    # them the oldest is closed (streams/admission.py, pre_login_to_drop).
    ssh_logins_per_rental: int = 32


def is_connection(request: StreamRequest) -> bool:
    """Tunnel and SSH connections, capped apart from logs and terminals."""
    return isinstance(request, (TunnelRequest, SshRequest))


def is_logging_in(request: StreamRequest) -> bool:
    """An SSH connection not logged in yet (and not closed to make room):
    it counts on the rental's few pre-login places, not on its cap."""
    return isinstance(request, SshRequest) and not request.login.logged_in and not request.login.dropped

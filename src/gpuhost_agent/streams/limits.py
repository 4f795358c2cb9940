"""How many streams the agent holds open at once, and for one rental (pure).

Two kinds, capped apart because they cost differently. Logs and terminals
hold up to 1 MiB of log buffer each and are few; tunnel and SSH connections
hold at most 64 KiB per direction and come by the hundred (a web UI opens
many connections, a renter may hold a thousand). Each kind has a cap for the
agent, which bounds its memory whatever the clients do, and a lower one for
one rental, so one renter's connections can never leave another renter
without a terminal or a tunnel. Past the rental's cap the request is refused
with 429 (the renter's own doing: close one), past the host's with 503 (the
host is busy); both with a reason naming the cap; nothing already open is
touched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuhost_agent.streams.requests import Refusal, SshRequest, StreamRequest, TunnelRequest


@dataclass(frozen=True)
class StreamLimits:
    streams: int = 64  # logs and terminals, the whole agent
    streams_per_rental: int = 32
    # Tunnel and SSH connections, the whole agent: about 100 KiB each held
    # (bench/tunnel.py --hold, both ends of the relay), so 2048 stay near 200 MiB.
    connections: int = 2048
    connections_per_rental: int = 1024


def is_connection(request: StreamRequest) -> bool:
    return isinstance(request, (TunnelRequest, SshRequest))


def refusal(request: StreamRequest, open_requests: Iterable[StreamRequest], limits: StreamLimits) -> Refusal | None:
    """Why `request` may not open now, or None."""
    connection = is_connection(request)
    same_kind = [r for r in open_requests if is_connection(r) == connection]
    mine = sum(1 for r in same_kind if r.rental_id == request.rental_id)
    if connection:
        total, per_rental, what = limits.connections, limits.connections_per_rental, "tunnel and SSH connections"
    else:
        total, per_rental, what = limits.streams, limits.streams_per_rental, "log streams and terminals"
    if len(same_kind) >= total:
        return Refusal(request.stream_id, 503, f"too many open {what} on this host ({total})")
    if mine >= per_rental:
        return Refusal(
            request.stream_id,
            429,
            f"this rental has {per_rental} open {what}, the most one rental may hold; close one and try again",
        )
    return None

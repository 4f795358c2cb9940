"""The TCP ports a container declares: each gets a tunnel, and a tunnel
dials no other (streams/tunnel.py, streams/admission.py, the door's
connect in streams/door_routes.py).

Compose records every `ports:` and `expose:` port in the container's
Config.ExposedPorts. `docker stack deploy` cannot: a Swarm service's spec
has no field for `expose`, so a container of it has ExposedPorts null and
only its published ports in the task's PortStatus. The agent's Swarm rewrite
(core/swarm/stack_file.py) therefore writes the `expose:` ports into a label of
the container, LABEL, which Swarm keeps as it is; the ports a container
declares are those of both records. Neither the renter's file nor the image
sets it: every `io.gpuhost.` label is the agent's (core/sandbox/policy.py), and
the agent sets this one on every container, empty but where the Swarm
rewrite fills it, over whatever the image's labels say. A tunnel reaches only
the container's own addresses whatever the ports.

The label's value: tcp ports and ranges as Compose writes them, comma
separated (`8080,7000-7002`); a udp port gets no tunnel and is left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuhost_agent.protocol import wire

LABEL = wire.LABEL_EXPOSED_PORTS  # set on every container (core/stacks/naming.py), empty but on a Swarm
MAX_PORT = 65535


def _entry(text: str) -> range | None:
    """One port or range (`8080`, `7000-7002`, with `/tcp` or not) as a
    range; None for a udp/sctp one or one that is not a port."""
    number, _, protocol = text.strip().partition("/")
    if protocol not in ("", "tcp"):
        return None
    low, dash, high = number.partition("-")
    if not low.isdigit() or (dash and not high.isdigit()):
        return None
    first, last = int(low), int(high) if dash else int(low)
    if not 0 < first <= last <= MAX_PORT:
        return None
    return range(first, last + 1)


def label_value(expose: Iterable[object]) -> tuple[str, list[str]]:
    """(the label's value for Compose's normalised `expose:` list, the entries
    that are no TCP or UDP port or range). An empty value: no TCP port."""
    kept, bad = [], []
    for item in expose:
        text = str(item).strip()
        if _entry(text) is not None:
            kept.append(text.removesuffix("/tcp"))
        elif text.partition("/")[2] not in ("udp", "sctp") or _entry(text.partition("/")[0]) is None:
            bad.append(text)
    return ",".join(kept), bad


def labelled_ports(labels: Mapping[str, object]) -> set[int]:
    """The ports the label names; an entry that is not one counts as none."""
    ports: set[int] = set()
    for text in str(labels.get(LABEL) or "").split(","):
        ports.update(_entry(text) or ())
    return ports


def declared_ports(info: Mapping[str, object]) -> set[int]:
    """The TCP ports the container declares (its `docker inspect`): the
    engine's ExposedPorts and the label's."""
    config = info.get("Config") or {}
    if not isinstance(config, Mapping):
        return set()
    ports = set()
    for key in config.get("ExposedPorts") or {}:
        number, _, protocol = str(key).partition("/")
        if protocol in ("", "tcp") and number.isdigit():
            ports.add(int(number))
    return ports | labelled_ports(config.get("Labels") or {})

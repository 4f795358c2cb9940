"""The Swarm's mutual TLS for tests, made as install.sh makes it
(service/swarm_tls.py): an environment CA, the leader's certificate beside
it, and a worker's from a bundle the leader's side wrote."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

from gpuhost_agent.service import swarm_tls


@dataclass(frozen=True)
class DoorTls:
    leader: Path  # the leader's TLS directory (with the CA's key)
    worker: Path  # a worker's
    contexts: dict[str, ssl.SSLContext] = field(default_factory=dict)  # made outside the event loop

    def server(self) -> ssl.SSLContext:
        return self.contexts["worker"]

    def client(self) -> ssl.SSLContext:
        return self.contexts["leader"]

    def checked_client(self) -> ssl.SSLContext:
        """The leader's as the agent makes it: the door must name the node dialled."""
        return self.contexts["leader-checked"]

    def curl(self) -> list[str]:
        """curl's options to speak to a door as the leader (-k: a worker's
        certificate names no address; the leader's own client checks the CA)."""
        return [
            "-k",
            "--cacert",
            str(self.leader / swarm_tls.CA_CERT),
            "--cert",
            str(self.leader / swarm_tls.CERT),
            "--key",
            str(self.leader / swarm_tls.KEY),
        ]


NODE = "testnode0000000000000000002"  # the worker's Swarm node id where no Swarm is up


def make_door_tls(base: Path, node: str = NODE) -> DoorTls:
    """`node`: the worker's Swarm node id, which its certificate names. The
    "leader" context takes any worker's (raw connections in tests);
    "leader-checked" asks the door to be `node`'s, as the agent's does."""
    leader, worker = base / "leader-tls", base / "worker-tls"
    swarm_tls.install_leader(leader)
    bundle = base / "worker-bundle.pem"
    bundle.write_bytes(swarm_tls.bundle(leader, node))
    swarm_tls.install_worker(bundle, worker, node)
    contexts = {
        "worker": swarm_tls.server_context(worker),
        "leader": swarm_tls.client_context(leader, node_checked=False),
        "leader-checked": swarm_tls.client_context(leader),
    }
    return DoorTls(leader, worker, contexts)

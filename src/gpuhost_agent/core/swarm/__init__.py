"""The Swarm backend, the core side: what a Swarm environment's leader does
that one machine does not. The Swarm rewrite of a hardened stack
(rewrite.py), the deploy with `docker stack` (backend.py), the watch over
the other machines (watch.py) and their container events (worker_events.py).
Only the composition root (service/) chooses these; the one-machine code
never imports them (tests/unit/test_topology_boundary.py)."""

"""The Swarm backend, the core side: what a Swarm environment's leader does
that one machine does not. The stack file for `docker stack` of a hardened
stack (stack_file.py), its placement on the machines (placement.py,
machine_shares.py), the deploy (backend.py), the environment's machines
(machines.py), the watch over them (watch.py) and their container events
(worker_events.py). Only the composition root (service/) chooses these; the
one-machine code never imports them (tests/unit/test_topology_boundary.py).
docs/swarm.md maps every Swarm file."""

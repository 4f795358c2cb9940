"""The rentals' tunnels: the book of listeners, the relay, the gate (basic
auth, passwords), the requests of a kept-alive connection, the probes."""

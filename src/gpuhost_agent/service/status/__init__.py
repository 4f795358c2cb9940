"""The agent's status: its socket's server, the `status` command, and what both show."""

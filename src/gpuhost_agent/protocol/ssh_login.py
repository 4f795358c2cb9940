"""The SSH login name that picks a container: `<service>.<first 8 characters of the stack id>`.
The agent's SSH server parses it, the marketplace's tunnel info shows it: one rule for both."""

from __future__ import annotations

# The SSH login name that picks a container: `<service>.<first 8 characters of
# the stack id>`. The agent's SSH server parses it, the marketplace's tunnel
# info shows it: one rule for both.
SSH_STACK_PREFIX = 8


def ssh_login_name(service: str, stack_id: str) -> str:
    return f"{service}.{stack_id[:SSH_STACK_PREFIX]}"

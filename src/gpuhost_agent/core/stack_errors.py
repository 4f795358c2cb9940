"""Why a stack does not run, as the sandbox, the image checks, the rentals'
shares and the deployer all say it; the dispatcher tells the renter."""

from __future__ import annotations

from gpuhost_agent.errors import OutsideFailure, Refusal


class StackRejected(Refusal, ValueError):
    """The stack cannot run as submitted; the message is meant for the renter."""


class StackFailed(OutsideFailure, RuntimeError):
    """Containers started but did not keep running (or the engine could not
    start them); the message names which and why."""

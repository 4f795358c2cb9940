"""The deployer's image pulls where this agent pulls none: every machine's
engine pulls the images of the containers it runs (a Swarm leader's stacks).

It stands where ImagePulls stands on one machine, so the deployer asks one
object the same things either way instead of checking for a missing one.
"""

from __future__ import annotations

from collections.abc import Callable


class PullsElsewhere:
    """ImagePulls' face to the deployer, doing nothing: no room to make,
    nothing to check or fetch, no use to record."""

    pulls_locally = False  # the images are not pulled by (nor kept on) this machine's engine

    async def make_room(self) -> None:
        """No image is kept here for the floor to evict."""

    async def check_room(self, rental_id: str, images: list[str]) -> None:
        """Each machine's engine finds its own room."""

    async def fetch(self, images: list[str], progress: Callable[[str], None], rental_id: str = "") -> dict[str, str]:
        """Nothing is pulled here: nothing failed."""
        return {}

    async def used(self, images: list[str]) -> None:
        """No cache here records what a stack used."""

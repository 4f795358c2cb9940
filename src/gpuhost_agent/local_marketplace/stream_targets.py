"""What the renter's logs and terminal requests share: which container they name,
and when the renter has gone away.

The marketplace checks the container against the list the agent pushed, so a
renter can only name containers of their own stack; the agent checks again
against its labels (docs/streams.md, section 2), whatever the marketplace believes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from aiohttp import web

from gpuhost_agent.local_marketplace.store import Conflict, NotFound, Store
from gpuhost_agent.protocol import wire

DISCONNECT_POLL_SECONDS = 0.2


def find_container(store: Store, rental_id: str, stack_id: str, container_id: str) -> str:
    """The container's full Id, named by Id or Name in the stack's container list.
    NotFound (404) for a rental, stack or container that is not there; Conflict
    (400) for a rental that has ended, whose containers are being removed."""
    rental = store.rental(rental_id)
    stack = store.stack(rental_id, stack_id)
    for container in store.containers.get(stack["stackId"], {}).get("containers", []):
        if container_id and container_id in (container.get("Id"), container.get("Name")):
            if rental["status"] != wire.RENTAL_ACTIVE:
                raise Conflict(f"rental {rental_id} has ended; its containers are being removed")
            return container["Id"]
    raise NotFound(f"container {container_id[:128]} not found in stack {stack_id} of rental {rental_id}")


def container_state(store: Store, stack_id: str, container_id: str) -> str:
    """The container's State as the agent last listed it ("running",
    "exited (1)", ...); "" when the list does not have it."""
    for container in store.containers.get(stack_id, {}).get("containers", []):
        if container.get("Id") == container_id:
            return str(container.get("State") or "")
    return ""


def rental_active(store: Store, rental_id: str) -> bool:
    rental = store.rentals.get(rental_id)
    return rental is not None and rental["status"] == wire.RENTAL_ACTIVE


async def renter_gone(request: web.Request) -> None:
    """Returns once the renter's connection has closed. aiohttp does not cancel
    a handler whose client left, and a quiet `follow` writes nothing that would
    fail, so the transport is watched."""
    while True:
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        await asyncio.sleep(DISCONNECT_POLL_SECONDS)


async def first_done(*awaitables: Awaitable[Any]) -> asyncio.Task:
    """Run the awaitables as tasks; return the first to finish, the others cancelled."""
    tasks = [asyncio.ensure_future(item) for item in awaitables]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return next(task for task in tasks if task in done)

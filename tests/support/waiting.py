"""Waiting for a condition without sleeping a fixed time."""

from __future__ import annotations

import asyncio
import inspect


async def until(predicate, timeout: float = 10) -> None:
    """Wait for a condition on in-process state (the store, the dispatcher), or
    for an async predicate (a question asked over HTTP)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        answer = predicate()
        if inspect.isawaitable(answer):
            answer = await answer
        if answer:
            return
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)

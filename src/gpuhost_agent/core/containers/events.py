"""What the engine's events and container lists say about a stack (pure).

The watch (container_watch.py) follows the event stream, reads lists and
pushes; the decisions it takes on what it read are here, apart from its
timers, tasks and engine, so that each is tested on plain dicts: which events
matter and what they name, which containers a list still shows running after
the engine said they died (it sends `die` before it updates what it lists),
and which errorMsg a stack's APPLIED status carries.

That errorMsg names the containers of an APPLIED stack that stopped by
themselves, and is cleared once every one runs again. Only a look that events
started may set one (`may_set`); the notes the agent keeps in a stack's
errorMsg (a GPU out of service, what the sandbox changed) stay with it.
"""

from __future__ import annotations

from gpuhost_agent.core.sandbox.apply import kept_notes
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.engine.records import ContainerSummary, EngineEvent
from gpuhost_agent.storage.agent_db import StackRow

# The actions that change what a stack's list shows; the others (exec, attach, ...)
# are not followed, and not even asked of the engine (wire.CONTAINER_EVENTS).
WATCHED = frozenset(wire.CONTAINER_EVENTS)


def error_to_report(record: StackRow | None, error: str, *, may_set: bool = True) -> str | None:
    """The errorMsg to send with APPLIED ("" clears it), or None to send nothing:
    only for a stack recorded APPLIED, only when it differs from the recorded one."""
    if not record or record.get("status") != wire.APPLIED:
        return None
    if error and not may_set:
        return None
    kept = kept_notes(record.get("error_msg") or "")  # a GPU out of service, what the sandbox changed: they stay
    error = "; ".join(part for part in (error, kept) if part)
    if error == (record.get("error_msg") or ""):
        return None
    return error


def list_behind(raw_list: list[ContainerSummary], died: set[str]) -> set[str]:
    """Containers the engine said died that its list still shows running: the
    engine sends `die` before it updates what it lists (after unmounting and
    releasing the network), so the list is read again a moment later."""
    return {raw["Id"] for raw in raw_list if raw.get("Id") in died and raw.get("State") == "running"}


def decode_event(event: EngineEvent) -> tuple[str, str, dict[str, str]]:
    """(action, container id, attributes) of an engine event; health_status
    actions carry the status after a colon."""
    actor = event.get("Actor") or {}
    action = str(event.get("Action") or event.get("status") or "").split(":", 1)[0].strip()
    return action, str(actor.get("ID") or event.get("id") or ""), actor.get("Attributes") or {}

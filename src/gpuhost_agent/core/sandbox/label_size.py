"""How many bytes of labels a renter's container may carry. Pure.

Labels are not only the renter's business: the engine puts every label of a
container into each of its events and every container list, and the agent
reads those for all renters (core/containers/watch.py), keeps the last list
of each stack and sends it to the marketplace (core/stacks/container_list.py:
the seed's Container has its Labels). A renter's megabytes of labels, from
the Compose file or baked into the image, so cost every renter's events and
the agent's memory; a stack's event line over 1 MiB is even skipped
(runtime/engine/client.py). 64 KiB is far above what published files and images
carry (Traefik's routing labels, OCI annotations: a few KiB) and far below
what hurts.

The same holds for a stack's networks and volumes, whose labels every
`GET /networks`, `GET /volumes` and `GET /system/df` carries, and every
deploy of every renter reads those lists (the policy's names check): their
labels together are held to the same 64 KiB a stack (300 volumes sharing
one 400 KiB anchor would make `GET /volumes` over 100 MB). A
container's command is in every container list too.

Sizes are counted as the engine's JSON writes them: `<`, `>`, `&` and
control characters take six bytes there (`\u003c`), so 64 KiB of them would
be 384 KiB on the wire.

The file's labels are judged with the rest of the policy, before anything
starts; the image's are known only once the image is here, so a container's
whole set (image and file) and its command are judged right after it
started, with the deploy's other checks (core/stacks/deployer.py), and the
stack fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuhost_agent.core.compose_values import as_mapping

MAX_LABEL_BYTES = 64 * 1024
MAX_LISTED_PORTS = 512  # a container's Ports entries (an image's EXPOSE too; a published port is listed twice)


_SIX_BYTES = frozenset("<>&\u2028\u2029") | {chr(code) for code in range(32)}


def json_bytes(text: str) -> int:
    """`text`'s length in the engine's JSON (Go's encoder): UTF-8, with `<`,
    `>`, `&`, U+2028/9 and control characters as six-byte escapes (a few
    controls take two, counted as six: an upper bound is what is wanted)."""
    return len(text.encode("utf-8", "surrogatepass")) + 5 * sum(1 for char in text if char in _SIX_BYTES)


def label_bytes(labels: Mapping[Any, Any] | None) -> int:
    """The size of `labels` as the engine's JSON carries them: each key and value."""
    return sum(json_bytes(str(key)) + json_bytes(str(value)) for key, value in (labels or {}).items())


def _bytes(size: int) -> str:
    return f"{size:,} bytes"


def file_labels_problem(labels: Mapping[Any, Any], owner: str = "service") -> str | None:
    """The labels of one service, network or volume in the Compose file, over the limit."""
    size = label_bytes(labels)
    if size <= MAX_LABEL_BYTES:
        return None
    return (
        f"labels are {_bytes(size)} in all, at most {_bytes(MAX_LABEL_BYTES)} (64 KiB) a {owner}: "
        f"every {'event and container' if owner == 'service' else owner} list of the engine carries them"
    )


def stack_resources_problem(model: Mapping[str, Any]) -> str | None:
    """The labels of the stack's networks and volumes together, over the limit."""
    size = sum(
        label_bytes(as_mapping((spec or {}).get("labels")))
        for section in ("networks", "volumes")
        for spec in (model.get(section) or {}).values()
        if isinstance(spec, Mapping) or spec is None
    )
    if size <= MAX_LABEL_BYTES:
        return None
    return (
        f"networks and volumes: their labels are {_bytes(size)} in all, at most {_bytes(MAX_LABEL_BYTES)} (64 KiB) "
        "a stack: every list of the engine's networks and volumes carries them, for every renter"
    )


def oversized_container(raw_list: Iterable[Mapping[str, Any]]) -> str | None:
    """The first container of an engine list whose labels (its image's and its
    file's) or command are over the limit, said for the renter; None when none is."""
    for raw in raw_list:
        names = raw.get("Names") or [raw.get("Name") or raw.get("Id", "?")]
        name = str(names[0]).lstrip("/")
        size = label_bytes(raw.get("Labels"))
        if size > MAX_LABEL_BYTES:
            return (
                f"deploy failed: container {name} carries {_bytes(size)} of labels (its image's and the file's), "
                f"at most {_bytes(MAX_LABEL_BYTES)} (64 KiB): every event and container list of the engine "
                "carries them; use an image with fewer labels"
            )
        ports = len(raw.get("Ports") or [])
        if ports > MAX_LISTED_PORTS:
            return (
                f"deploy failed: container {name} declares {ports:,} ports (its image's EXPOSE and the file's), "
                f"at most {MAX_LISTED_PORTS}: every container list of the engine carries them; "
                "use an image that exposes fewer"
            )
        size = json_bytes(str(raw.get("Command") or ""))
        if size > MAX_LABEL_BYTES:
            return (
                f"deploy failed: container {name}'s command is {_bytes(size)} (its image's and the file's), "
                f"at most {_bytes(MAX_LABEL_BYTES)} (64 KiB): every container list of the engine carries it; "
                "put a long script in a file of the image or a config instead"
            )
    return None

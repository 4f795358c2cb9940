"""How many bytes of labels a renter's container may carry. Pure.

Labels are not only the renter's business: the engine puts every label of a
container into each of its events and every container list, and the agent
reads those for all renters (core/containers/watch.py), keeps the last list
of each stack and sends it to the marketplace (core/containers/seed_list.py:
the seed's Container has its Labels). A renter's megabytes of labels, from
the Compose file or baked into the image, so cost every renter's events and
the agent's memory; a stack's event line over 1 MiB is even skipped
(runtime/engine.py). 64 KiB is far above what published files and images
carry (Traefik's routing labels, OCI annotations: a few KiB) and far below
what hurts.

The file's labels are judged with the rest of the policy, before anything
starts; the image's are known only once the image is here, so a container's
whole set (image and file) is judged right after it started, with the
deploy's other checks (core/stacks/deployer.py), and the stack fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MAX_LABEL_BYTES = 64 * 1024


def label_bytes(labels: Mapping[Any, Any] | None) -> int:
    """The size of `labels` as the engine's JSON carries them, near enough:
    each key and value in UTF-8."""
    return sum(len(str(key).encode()) + len(str(value).encode()) for key, value in (labels or {}).items())


def _bytes(size: int) -> str:
    return f"{size:,} bytes"


def file_labels_problem(labels: Mapping[Any, Any]) -> str | None:
    """A service's labels in the Compose file, over the limit."""
    size = label_bytes(labels)
    if size <= MAX_LABEL_BYTES:
        return None
    return (
        f"labels are {_bytes(size)} in all, at most {_bytes(MAX_LABEL_BYTES)} (64 KiB) a service: "
        "every event and container list of the engine carries them"
    )


def oversized_container(raw_list: Iterable[Mapping[str, Any]]) -> str | None:
    """The first container of an engine list whose labels (its image's and its
    file's) are over the limit, said for the renter; None when none is."""
    for raw in raw_list:
        size = label_bytes(raw.get("Labels"))
        if size > MAX_LABEL_BYTES:
            names = raw.get("Names") or [raw.get("Name") or raw.get("Id", "?")]
            name = str(names[0]).lstrip("/")
            return (
                f"deploy failed: container {name} carries {_bytes(size)} of labels (its image's and the file's), "
                f"at most {_bytes(MAX_LABEL_BYTES)} (64 KiB): every event and container list of the engine "
                "carries them; use an image with fewer labels"
            )
    return None
